"""The data a run will read, described once for the tasks' `detect` (tasks/settle.py asks each registry line
in order): the options, the training split (`train`, opened once), whether it is readable before training,
holds images or plain text, and what its labels hold. Each fact is read on first use and kept."""

from __future__ import annotations

from functools import cached_property

from ..config import TrainConfig


class Source:
    def __init__(self, cfg: TrainConfig, given=None):
        self.cfg, self.given = cfg, given

    @cached_property
    def image_folder(self) -> bool:
        from .sources import ImageFolder

        return self.given is None and ImageFolder.scan(self.cfg.data.dataset) is not None

    @cached_property
    def readable(self) -> bool:
        """Whether the training split can be looked at before training (not a stream, generated data or images)."""
        generated = self.given is None and self.cfg.data.dataset == "synthetic"
        return not (self.cfg.data.streaming or generated or self.image_folder)

    @cached_property
    def train(self):
        from .sources import opened

        return opened(self.cfg, self.given)[0]["train"]

    @cached_property
    def plain_text(self) -> bool:
        """Text without labels: the bundled shakespeare, .txt files, --text-column without --label-column."""
        from .sources import is_text_dataset

        data = self.cfg.data
        labelled = "label_column" in self.cfg.given
        return is_text_dataset(data.dataset, data.text_column) and not (data.text_column and labelled)

    @cached_property
    def images(self) -> bool:
        """An image folder, or a dataset whose training split has an Image column."""
        from .images import image_column

        if self.image_folder:
            return True
        if self.cfg.data.text_column or self.cfg.data.streaming:
            return False
        return image_column(self.train, self.cfg) is not None

    @cached_property
    def labels(self) -> tuple[str, str] | None:
        """(what the training labels hold, why: targets.LISTS, VALUES or CLASSES), or None where there are none
        to read (streams, images, generated data, or a missing label column, which the loader names)."""
        from .targets import label_columns, label_form, labels_of

        if not self.readable:
            return None
        if any(c not in self.train.column_names for c in label_columns(self.cfg)):
            return None
        return label_form(labels_of(self.train, self.cfg), self.cfg.data.label_column)
