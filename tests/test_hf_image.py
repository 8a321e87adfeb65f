"""Image classification with a transformers vision model (`--model hf:` on images: the registry's
`hf:classify-images`), offline: a tiny ViT with its image processor (tests/hfmodels.py) fine-tuned on the
bundled digits drawn as an image folder (tests/imagedata.py) to at least 0.9 test accuracy, its 10-label
head replaced by one for the data's classes; `anytrain predict` gives what transformers' own
from_pretrained(run_dir/hf) with AutoImageProcessor gives; accumulation = big batch, 2 ranks = 1 rank,
SIGKILL + --resume bit-identical; bad input is one line."""

from __future__ import annotations

import pytest
import torch
from conftest import run_cli_error
from hfchecks import big_batch, check_accumulation, check_kill_and_resume, check_two_ranks, in_process
from hfmodels import tiny_bert, tiny_vit
from imagedata import write_imagefolder

from anytrain.predict import predict
from anytrain.reload import read_weights_metadata

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("vit")
    return {
        "digits": write_imagefolder(root / "digits", size=16),  # 1,797: 1,259 / 179 / 359
        "few": write_imagefolder(root / "few", size=16, count=400),
        "vit": tiny_vit(root / "vit"),
        "quick": tiny_vit(root / "quick", init_std=0.1),  # learns in 6 epochs, not 20 (tests/hfmodels.py)
    }


def args(folders, *flags: str) -> list[str]:
    return ["--model", f"hf:{folders['vit']}", "--dataset", str(folders["few"]), *flags]


@pytest.fixture(scope="module")
def reference(folders, tmp_path_factory):
    return big_batch(args(folders), tmp_path_factory.mktemp("vit_big"))


def test_the_vit_learns_the_digits_and_predict_gives_what_transformers_loads(folders, tmp_path):
    from transformers import AutoImageProcessor, AutoModelForImageClassification
    from transformers.utils import logging

    run_dir = tmp_path / "run"
    flags = ["--model", f"hf:{folders['quick']}", "--dataset", str(folders["digits"])]
    summary = in_process(run_dir, *flags, "--lr", "5e-3", "--epochs", "6", "--batch-size", "32")
    assert summary["task"] == "classify" and summary["test_accuracy"] >= 0.9, summary  # measured 0.95
    assert summary["image_processor"].startswith("ViTImageProcessor") and summary["image_size"] == 16
    assert read_weights_metadata(run_dir)[2]["task_module"] == "hf:classify-images"
    predicted = predict(str(run_dir), str(folders["few"]))
    logging.set_verbosity_error()  # its PIL backend, without torchvision, as the run used
    processor = AutoImageProcessor.from_pretrained(run_dir / "hf")
    model = AutoModelForImageClassification.from_pretrained(run_dir / "hf").eval()
    assert model.config.num_labels == 10 and model.config.id2label[3] == "3"
    import datasets
    from PIL import Image

    rows = datasets.load_dataset("imagefolder", data_dir=str(folders["few"]))["train"]["image"][:20]  # predict's order
    with torch.no_grad():
        pixels = processor([Image.open(row.filename).convert("RGB") for row in rows], return_tensors="pt")
        theirs = model(**pixels).logits.argmax(-1).tolist()
    assert [row["class_id"] for row in predicted[:20]] == theirs
    assert sum(row["class_id"] == row["label"] for row in predicted) / len(predicted) > 0.85


def test_accumulation_equals_one_big_batch(folders, reference, tmp_path, monkeypatch):
    check_accumulation(args(folders), reference, tmp_path, monkeypatch)


@pytest.mark.launch
def test_two_ranks_equal_one_rank(folders, reference, tmp_path):
    check_two_ranks(args(folders), reference, tmp_path)


@pytest.mark.launch
def test_sigkill_mid_run_then_resume_is_bit_identical(folders, tmp_path):
    check_kill_and_resume(args(folders), tmp_path, "vit")


def test_bad_input_is_one_line_and_writes_nothing(folders, tmp_path, capsys):
    import shutil

    out = tmp_path / "out"
    bare = shutil.copytree(folders["vit"], tmp_path / "bare")
    (bare / "preprocessor_config.json").unlink()
    err = run_cli_error(capsys, ["--model", f"hf:{bare}", "--dataset", str(folders["few"]), "--output-dir", str(out)])
    assert "no preprocessor_config.json in this folder" in err
    bert = tiny_bert(tmp_path / "bert")
    err = run_cli_error(capsys, ["--model", f"hf:{bert}", "--dataset", str(folders["few"]), "--output-dir", str(out)])
    assert "a bert model has no image-classification head" in err or "no preprocessor_config.json" in err
    err = run_cli_error(capsys, [*args(folders), "--task", "regress", "--output-dir", str(out)])
    assert "transformers models train --task classify" in err
    assert not out.exists()
