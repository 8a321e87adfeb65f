"""classify: targets are class ids; the model returns logits (batch, classes); cross-entropy; accuracy.
Tables of numbers, images and streams come through data/tables.py; text to classify (--text-column
with --label-column) through data/textcls.py (token ids padded to each batch's longest text).

It stands on Labelled (the model, the data's shape, predict's rows) and composes ClassIds (the loss, metrics,
predictions and the data it fits), both in tasks/labelled.py.
"""

from __future__ import annotations

from ..config import ConfigError, TrainConfig
from ..data.splits import Splits
from .labelled import ClassIds, Labelled


class Classification(ClassIds, Labelled):
    name = "classify"
    offers = frozenset({"predict", "streaming"})

    @classmethod
    def fits(cls, cfg: TrainConfig) -> tuple[tuple[str, ...] | None, str]:
        if cfg.data.text_column:
            return ("encoder", "bag"), "--task classify with --text-column"
        return super().fits(cfg)

    @classmethod
    def check_settled(cls, cfg: TrainConfig, reason: str) -> None:
        if cfg.data.streaming and cfg.data.text_column:
            raise ConfigError(
                "--streaming reads classification data (tables of numbers or images); text is tokenised first "
                "instead (into memory, or memory-mapped files for language models)"
            )

    def load_data(self, given=None) -> Splits:
        if not self.cfg.data.text_column:
            return super().load_data(given)
        from ..data.textcls import load_text_class_splits

        self.data = load_text_class_splits(self.cfg, given)
        return self.data
