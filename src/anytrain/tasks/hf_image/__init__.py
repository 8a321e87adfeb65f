"""classify images with a transformers vision model (ViT, ConvNeXt, ...): AutoModelForImageClassification
with num_labels, id2label and label2id from the data (a checkpoint's head for another label count is
replaced), the images prepared by the model's own AutoImageProcessor (tasks/hf_image/hfimages.py), trained on the
model's own loss (cross-entropy per image). The class stands on Transformers (tasks/transformers.py) and composes
ClassIds (tasks/labelled.py: the loss, metrics and predictions of every classifier over class ids); the run ends
with the model and its image processor saved in run_dir/hf, which transformers' pipelines load."""

from __future__ import annotations

from pathlib import Path

from torch import nn

from ...data.splits import Splits
from ...hf import Head
from ..labelled import ClassIds
from ..transformers import Transformers


class HFImageClassification(ClassIds, Transformers):
    name = "classify"
    offers = frozenset({"export", "predict"})
    head = Head("AutoModelForImageClassification", "image-classification", labelled=True, positions=False)

    @classmethod
    def reads(cls, source) -> bool:
        return source.images

    def load_data(self, given=None) -> Splits:
        from ... import hf
        from .hfimages import image_splits, load_processor

        self.processor = load_processor(hf.check_folder(self.cfg))
        channels = hf.num_channels(self.cfg)
        self.data = image_splits(self.cfg, self.processor, channels, given)
        self.model_config = self.checked_config(None)
        return self.data

    def export(self, model: nn.Module, run_dir: Path) -> None:
        from ... import hf

        hf.save_pretrained(model, self.processor, run_dir)

    def predict_inputs(self, dataset: str, meta: dict, folder: Path) -> tuple:
        from ...hf import FOLDER
        from .hfimages import load_processor, predict_images

        processor = load_processor(str(folder / FOLDER))
        channels = meta["data_shape"].channels
        return predict_images(dataset, meta["input_columns"][0], processor, channels)
