"""Images: an imagefolder of PNGs and a parquet with an Image column, generated here from the
bundled digits (grayscale and RGB, one size or mixed sizes), decoded per batch in DataLoader
workers; augmentation reproducible with any number of workers and across a kill and resume; a
file that cannot be decoded named in one line."""

from __future__ import annotations

import multiprocessing
import os
import shutil
import signal
from pathlib import Path

import pytest
import torch
from conftest import ROOT, finish_run, launch, max_abs_diff, read_summary, start_run, wait_for_step
from imagedata import digit_images, write_image_parquet, write_imagefolder

import anytrain
from anytrain.cli import main
from anytrain.config import TrainConfig
from anytrain.data.images import ImageRows, auto_image_workers
from anytrain.data.sources import read_dataset, unsplit_files
from anytrain.predict import predict
from anytrain.tasks.settle import load, settle

EXAMPLE = ROOT / "examples" / "own_model.py"


def load_data(cfg, given=None):
    """The data a run of this config trains on (its task settled first)."""
    return load(cfg, given)[2]


@pytest.fixture(scope="module")
def gray(tmp_path_factory) -> Path:
    """All 1,797 digits as 16 x 16 grayscale PNGs, one folder per class."""
    return write_imagefolder(tmp_path_factory.mktemp("images") / "gray16", size=16, mode="L")


# A small ResNet (2 stages of 1 block, 19.7k parameters): ~5 s for 3 epochs on one thread.
RESNET = {
    "model": "resnet",
    "channels": [16, 32],
    "blocks_per_stage": 1,
    "dropout": 0.0,
    "lr": 0.01,
    "weight_decay": 5e-4,
    "epochs": 3,
    "progress": False,
}


def test_an_imagefolder_trains_a_resnet_the_same_with_0_and_2_persistent_workers(
    tmp_path, gray, one_thread, monkeypatch
):
    epochs, real = [], ImageRows.set_epoch
    monkeypatch.setattr(
        ImageRows, "set_epoch", lambda self, epoch: (self.split == "train" and epochs.append(epoch), real(self, epoch))
    )
    # workers kept alive across epochs still see each new epoch (it is in shared memory)
    runs = {
        w: anytrain.train(
            {**RESNET, "epochs": 2},
            dataset=str(gray),
            augment=["crop"],
            num_workers=w,
            persistent_workers=w > 0,
            output_dir=str(tmp_path / f"w{w}"),
        )
        for w in (0, 2)
    }
    s = runs[0]
    assert s["model"] == "resnet" and s["image_mode"] == "L" and s["image_size"] == 16 and s["augment"] == ["crop"]
    assert s["data_path"].startswith("arrow") and s["train_samples"] == 1797 - 179 - 359
    assert s["test_accuracy"] > 0.8, s["test_accuracy"]  # 2 epochs of crops: measured 0.84
    assert (
        max_abs_diff(
            anytrain.load_model(tmp_path / "w0").state_dict(), anytrain.load_model(tmp_path / "w2").state_dict()
        )
        == 0.0
    )
    assert runs[2]["test_accuracy"] == s["test_accuracy"]
    changes = [e for i, e in enumerate(epochs) if i == 0 or e != epochs[i - 1]]
    assert changes == [0, 1] * 2  # the dataset learns each epoch, so the augmentation changes with it


def test_rgb_images_of_mixed_sizes_are_resized_and_a_parquet_image_column_trains(tmp_path, one_thread):
    mixed = write_imagefolder(tmp_path / "rgb", size=16, mode="RGB", count=900, sizes=(12, 16, 20))
    summary = anytrain.train(
        dataset=str(mixed),
        model="mlp",
        image_size=16,
        augment=[],
        hidden_sizes=[128],
        epochs=4,
        progress=False,
        output_dir=str(tmp_path / "rgb_run"),
    )
    assert summary["image_mode"] == "RGB" and summary["image_size"] == 16 and len(summary["image_mean"]) == 3
    assert (
        summary["num_workers"] == auto_image_workers() == (1 if len(os.sched_getaffinity(0)) > 1 else 0)
    )  # auto: one thread computes, a worker decodes
    assert summary["test_accuracy"] > 0.8, summary["test_accuracy"]  # measured 0.92
    table = write_image_parquet(tmp_path / "digits.parquet", size=8, mode="L", count=900)
    summary = anytrain.train(
        dataset=str(table),
        model="cnn",
        channels=[16],
        augment=[],
        epochs=4,
        progress=False,
        output_dir=str(tmp_path / "pq_run"),
    )
    assert summary["image_mode"] == "L" and summary["image_size"] == 8 and summary["model"] == "cnn"
    assert summary["test_accuracy"] > 0.8, summary["test_accuracy"]  # measured 0.92
    rows = predict(
        str(tmp_path / "pq_run"), str(table)
    )  # new images go through the run's own conversion and normalisation
    assert len(rows) == 900 and rows[0]["class_name"] == str(rows[0]["class_id"])
    assert sum(r["class_id"] == r["label"] for r in rows) / len(rows) > 0.8


def test_auto_workers_give_images_a_worker_only_where_it_has_a_core(monkeypatch):
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    assert auto_image_workers() == 0  # 2 cores, 2 torch threads: a worker would only slow the step
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    assert auto_image_workers() == 1
    assert auto_image_workers(local_processes=4) == 0  # 4 processes x 2 threads fill the 8 cores


def test_augmentation_is_a_function_of_seed_epoch_and_index(gray):
    data = load_data(TrainConfig(dataset=str(gray), augment=["crop", "flip"]))
    first, _ = data.train.__getitems__([0, 5, 9])
    again, _ = data.train.__getitems__([9, 0])
    assert torch.equal(first[0], again[1]) and torch.equal(first[2], again[0])  # the same image in any batch
    data.train.set_epoch(1)
    other, _ = data.train.__getitems__([0, 5, 9])
    assert not torch.equal(first, other)  # a new epoch draws new crops and flips
    plain, _ = data.validation.__getitems__([0, 1])
    look = data.validation.look  # normalised with the training split's statistics, saved with the weights
    assert plain.shape == (2, 1, 16, 16) and abs(plain.mean().item()) < 1.0
    assert data.facts["image_mean"] == look.mean.tolist() and data.metadata["image_look"]["size"] == 16


def test_an_image_that_cannot_be_decoded_is_named_in_one_line(tmp_path, capsys):
    root = tmp_path / "split"
    write_imagefolder(root / "train", size=16, mode="L", count=300)
    write_imagefolder(root / "validation", size=16, mode="L", count=60)
    bad = root / "validation" / "3" / "bad.png"
    bad.write_bytes(
        b"not a png at all"
    )  # in the validation split: found by a loader worker, not by the statistics pass
    with pytest.raises(SystemExit) as exc:
        main(
            [
                "--dataset",
                str(root),
                "--model",
                "mlp",
                "--hidden-sizes",
                "16",
                "--epochs",
                "1",
                "--num-workers",
                "2",
                "--no-progress",
                "--no-plot",
                "--output-dir",
                str(tmp_path / "run"),
            ]
        )
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(
        f"train.py: error: --dataset: cannot decode image {bad} (UnidentifiedImageError"
    ), err
    # the exit held here keeps no traceback, so the loader's worker processes are gone already (held, a garbage
    # collection later in the process would stop for 5 s per worker to shut them down)
    assert exc.value.__context__.__traceback__ is None and not multiprocessing.active_children()


def test_an_image_folder_without_split_names_is_read_as_datasets_reads_it_without_its_66_globs(tmp_path, monkeypatch):
    import datasets

    folder = write_imagefolder(tmp_path / "digits", size=8, count=60)
    theirs = datasets.load_dataset("imagefolder", data_dir=str(folder))  # datasets' own inference of the splits
    monkeypatch.setattr(datasets.load, "get_data_patterns", lambda *a, **k: pytest.fail("datasets globbed the tree"))
    ours, _ = read_dataset(str(folder))
    assert list(ours) == list(theirs) == ["train"] and ours["train"].features == theirs["train"].features
    assert ours["train"]["label"] == theirs["train"]["label"]
    assert [i.filename for i in ours["train"]["image"]] == [i.filename for i in theirs["train"]["image"]]
    # a name that may hold a split (train/, test_0.png, a class "interval", a data/ folder): datasets infers them
    for name in ("train", "test_0.png", "interval", "data"):
        (tmp_path / name / "sub").mkdir(parents=True)
        assert unsplit_files(tmp_path) is None, name
        shutil.rmtree(tmp_path / name)
    assert unsplit_files(tmp_path) == {"train": "**"}


def test_an_image_folder_with_stray_text_files_trains_as_images_and_counts_them(tmp_path, capsys, one_thread):
    """A notes.txt beside the class folders no longer makes the folder a text corpus: the run
    classifies the images, says at start which files it skipped, and lists them in summary.json."""
    folder = write_imagefolder(tmp_path / "img", size=8, count=600)
    (folder / "notes.txt").write_text("where these images came from")
    (folder / "3" / "README.txt").write_text("the threes")
    (folder / ".DS_Store").write_bytes(b"hidden: datasets ignores it, and so does the count")
    assert settle(TrainConfig(dataset=str(folder))).reason == "auto"  # not lm: the class folders make it classify
    s = anytrain.train(
        {"model": "mlp", "hidden_sizes": [64], "dropout": 0.0, "augment": [], "lr": 0.01, "epochs": 4},
        dataset=str(folder),
        progress=False,
        output_dir=str(tmp_path / "run"),
    )
    out = capsys.readouterr().out
    line = f"anytrain: skipped 2 files that are not images in {folder}: 3/README.txt, notes.txt"
    assert out.splitlines().count(line) == 1, out
    assert s["skipped_files"] == read_summary(tmp_path / "run")["skipped_files"] == ["3/README.txt", "notes.txt"]
    assert s["image_mode"] == "L" and s["num_classes"] == 10 and s["train_samples"] == 600 - 60 - 120
    assert s["test_accuracy"] > 0.85, s["test_accuracy"]


def test_a_folder_is_an_image_folder_when_it_holds_images_even_beside_more_text_files(tmp_path):
    """datasets alone picks the builder by the most common suffix; here .txt outnumbers .png."""
    folder = write_imagefolder(tmp_path / "img", size=8, count=20)
    for i in range(25):
        (folder / f"note{i:02d}.txt").write_text(f"note {i}")
    data = load_data(TrainConfig(dataset=str(folder), model="mlp"))
    assert len(data.train) + len(data.validation) + len(data.test) == 20 and len(data.facts["skipped_files"]) == 25
    assert data.notes == [
        f"skipped 25 files that are not images in {folder}: note00.txt, note01.txt, note02.txt, note03.txt, "
        "note04.txt and 20 more"
    ]
    text = tmp_path / "corpus"  # a folder of .txt files and no images is still text
    text.mkdir()
    (text / "a.txt").write_text("hello")
    assert settle(TrainConfig(dataset=str(text))).cfg.data.task == "lm"


def _class_folders(root: Path, layout: dict[str, int]) -> Path:
    images, _ = digit_images(size=8, count=sum(layout.values()))
    for folder, count in layout.items():
        (root / folder).mkdir(parents=True, exist_ok=True)
        for i in range(count):
            images.pop().save(root / folder / f"{i}.png")
    return root


@pytest.mark.parametrize(
    "layout, expected",
    [
        (
            {"cat": 6},
            "{root} holds one class folder (cat); a classifier needs at least 2, one subfolder of images per class",
        ),
        (
            {".": 6},
            "{root} holds images but no class folders; a classifier needs at least 2, one subfolder of "
            "images per class",
        ),
        (
            {"cat": 3, "dog/small": 3},
            "the images of {root} lie at different folder depths, so they have no class "
            "folders; a classifier needs at least 2, one subfolder of images per class ({root}/CLASS/IMAGE)",
        ),
    ],
)
def test_an_image_folder_without_two_class_folders_says_so(tmp_path, capsys, layout, expected):
    root = _class_folders(tmp_path / "pets", layout)
    with pytest.raises(SystemExit) as exc:
        main(["--dataset", str(root), "--no-progress", "--output-dir", str(tmp_path / "run")])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err == f"train.py: error: --dataset: {expected.format(root=root)}", err
    assert not (tmp_path / "run").exists()  # nothing written


@pytest.mark.launch
def test_the_example_model_on_augmented_images_trains_the_same_on_2_ranks_as_on_1(tmp_path, gray):
    """examples/own_model.py (a model outside the package) on 1 and 2 ranks. 2 ranks x 32 = 1 rank x 64 only if each
    rank augments a sample as the single rank did, in every epoch (accelerate tells the dataset the epoch on one
    rank, not on several: the loop does it)."""
    # 449 test, 132 validation, 1,216 = 19 x 64 training images: no padded batch; no batch-norm statistics per rank
    common = [
        "--dataset",
        str(gray),
        "--model",
        f"{EXAMPLE}:build",
        "--dropout",
        "0",
        "--augment",
        "crop",
        "flip",
        "--epochs",
        "2",
        "--test-fraction",
        "0.25",
        "--val-fraction",
        "0.0735",
        "--num-workers",
        "0",
    ]
    one = launch("cpu.yaml", *common, "--batch-size", "64", "--output-dir", str(tmp_path / "one"))
    two = launch("multi_cpu.yaml", *common, "--batch-size", "32", "--output-dir", str(tmp_path / "two"))
    assert one.returncode == 0 and two.returncode == 0, (one.stderr[-2000:], two.stderr[-2000:])
    s1, s2 = read_summary(tmp_path / "one"), read_summary(tmp_path / "two")
    assert (
        s2["scenario"]["num_processes"] == 2
        and len(set(s2["weights_sha256_per_rank"])) == 1
        and s1["model"] == f"{EXAMPLE}:build"
    )
    assert s1["test_accuracy"] > 0.8, s1["test_accuracy"]  # 2 epochs of crops and flips (measured 0.93)
    diff = max_abs_diff(
        anytrain.load_model(tmp_path / "one").state_dict(), anytrain.load_model(tmp_path / "two").state_dict()
    )
    assert diff < 1e-5, diff


@pytest.mark.launch
def test_a_kill_and_resume_with_workers_and_augmentation_is_bit_identical(tmp_path, gray):
    args = [
        "--dataset",
        str(gray),
        "--model",
        "mlp",
        "--hidden-sizes",
        "256",
        "--dropout",
        "0.2",
        "--augment",
        "crop",
        "flip",
        "--num-workers",
        "2",
        "--batch-size",
        "32",
        "--epochs",
        "2",
        "--checkpoint-every-steps",
        "9",
        "--log-every-steps",
        "1",
        "--no-progress",
    ]
    reference = start_run(tmp_path / "reference", args, env={"OMP_NUM_THREADS": "1"})
    victim = start_run(tmp_path / "victim", args, env={"OMP_NUM_THREADS": "1"})
    wait_for_step(tmp_path / "victim", 48, victim)  # epoch 1 of 2 (40 steps each), past its checkpoint at step 45
    os.killpg(victim.pid, signal.SIGKILL)
    victim.wait()
    # the checkpoint there when the kill landed (on a loaded machine the run may have passed step 54 by then)
    latest = (tmp_path / "victim" / "checkpoints" / "latest").read_text().strip()
    assert int(latest.removeprefix("step-")) > 40, latest  # mid-epoch 1: the resume skips batches of an epoch
    resumed = start_run(tmp_path / "victim", args, "--resume", env={"OMP_NUM_THREADS": "1"})
    for proc in (reference, resumed):
        code, err = finish_run(proc)
        assert code == 0, err[-3000:]
    assert read_summary(tmp_path / "victim")["resumed_from"].endswith(latest)
    assert (
        max_abs_diff(
            anytrain.load_model(tmp_path / "reference").state_dict(),
            anytrain.load_model(tmp_path / "victim").state_dict(),
        )
        == 0.0
    )
