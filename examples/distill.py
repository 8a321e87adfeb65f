"""Knowledge distillation (Hinton et al. 2015) as one task file: a small student learns the bundled digits
from both the labels and a finished anytrain run, the teacher, through anytrain's own loop.

Train a teacher, then a student that learns from it (the student must split the data as the teacher did:
the same --dataset, --seed, --val-fraction and --test-fraction, so the teacher never saw its test rows):

    anytrain train --model mlp --hidden-sizes 256 256 --epochs 10 --batch-size 64 --seed 1 --output-dir runs/teacher
    anytrain train --task examples/distill.py:Distill --teacher runs/teacher --model mlp --hidden-sizes 16 \\
        --dropout 0 --lr 0.01 --epochs 10 --batch-size 64 --seed 1 --output-dir runs/student

The student run is then a classifier of its own: `anytrain predict runs/student --dataset FILE` and
`anytrain.load_model("runs/student")` need no teacher, only this file where the run found it.

Offline distillation: load_data runs the teacher once over every row of every split and stores its logits
beside the class id, so each target row is [class id, teacher logit 0, ..., teacher logit C-1]. The loop,
several processes, gradient accumulation and exact resume then need nothing special: the teacher is not in
memory while the student trains, and checkpoints hold only the student.

    loss = alpha * CE(student, label) + (1 - alpha) * T^2 * KL(softmax(teacher / T) || softmax(student / T))
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.nn import functional as F

from anytrain import (
    HIGHER,
    LOWER,
    ConfigError,
    Task,
    TensorPairs,
    load_labelled,
    load_model,
    make_model,
    option,
    predict_rows,
    read_config,
)

# The options that decide which rows land in which split: the teacher's must equal the student's.
SAME_SPLIT = [("data", f) for f in ("dataset", "input_columns", "label_column", "val_fraction", "test_fraction")]
SAME_SPLIT += [("run", "seed")]


@dataclass(frozen=True)
class DistillOptions:
    teacher: str = option(
        "", "the teacher's run folder: a finished anytrain run on the same data and split", required=True
    )
    temperature: float = option(4.0, "T: softens both distributions before they are compared", bounds="(0, inf)")
    alpha: float = option(0.5, "the hard labels' weight; 1 - alpha goes to matching the teacher", bounds="[0, 1]")


class Distill(Task):
    name = "kd"  # its config section (kd:); the registry's --task distill is on-policy LLM distillation
    goals = {"loss": LOWER, "accuracy": HIGHER, "agreement": HIGHER}
    headline = "accuracy"
    offers = frozenset({"predict"})
    options = DistillOptions
    targets_to_model = False  # a model's own loss would not know what the teacher's columns mean

    # --------------------------------------------------------------------------- settling: before any file is written
    @classmethod
    def check_settled(cls, cfg, reason: str) -> None:
        """The teacher's folder exists, holds finished weights and split the data as this run will."""
        folder = cfg.section(cls.name).teacher  # given: --teacher is required
        if not (Path(folder) / "model.safetensors").is_file() or not (Path(folder) / "config.yaml").is_file():
            raise ConfigError(f"--teacher: {folder} is not a finished anytrain run folder (no model.safetensors)")
        try:
            teacher = read_config(folder)
        except ConfigError as err:
            raise ConfigError(f"--teacher: {err}") from None
        for section, field in SAME_SPLIT:
            ours, theirs = getattr(cfg.section(section), field), getattr(teacher.section(section), field)
            if theirs != ours:
                flag = "--" + field.replace("_", "-")
                raise ConfigError(
                    f"--teacher: {folder} was trained with {flag} {theirs}, this run has {ours}: its training rows "
                    f"would include this run's validation and test rows; give the student {flag} {theirs}"
                )

    # --------------------------------------------------------------------------- data: the teacher's logits as targets
    def load_data(self, given=None):
        data = load_labelled(self.cfg, given)
        splits = {"train": data.train, "validation": data.validation, "test": data.test}
        if not all(isinstance(split, TensorPairs) for split in splits.values()):
            raise ConfigError("examples/distill.py reads tables held in memory (not images, streams or Arrow files)")
        teacher = self.teacher_model()
        classes = data.shape.num_classes
        with_logits = {name: TensorPairs(s.inputs, with_teacher(teacher, s, classes)) for name, s in splits.items()}
        facts = {**data.facts, "teacher": self.cfg.section(self.name).teacher}
        facts["teacher_parameters"] = sum(p.numel() for p in teacher.parameters())
        self.data = dataclasses.replace(data, **with_logits, facts=facts)
        return self.data

    def teacher_model(self) -> torch.nn.Module:
        folder = self.cfg.section(self.name).teacher
        # Building the teacher draws its initial weights from the RNG the loop seeded for the student's:
        # put the RNG back, so the student starts from the weights a plain classifier with this --seed has.
        try:
            with torch.random.fork_rng(devices=[]):
                return load_model(folder)  # in eval mode
        except ConfigError as err:
            raise ConfigError(f"--teacher: {err}") from None

    # --------------------------------------------------------------------------- the student
    def build_model(self, given=None):
        return make_model(self.cfg.model, self.data.shape, given)

    def model_from_metadata(self, meta, given=None):
        return make_model(self.cfg.model, meta["data_shape"], given)

    # --------------------------------------------------------------------------- loss and metrics
    def loss(self, outputs, targets):
        """alpha * CE(student, label) + (1 - alpha) * T^2 * KL(softmax(teacher / T) || softmax(student / T)),
        each a mean over the batch; T^2 keeps the soft part's gradients as large as T grows (Hinton et al.)."""
        labels, teacher = targets[:, 0].long(), targets[:, 1:]
        own = self.cfg.section(self.name)
        hard = F.cross_entropy(outputs.float(), labels)  # --task classify's loss, to the bit (so alpha 1 is it)
        student = F.log_softmax(outputs.float() / own.temperature, -1)
        soft = F.kl_div(student, F.log_softmax(teacher / own.temperature, -1), log_target=True, reduction="batchmean")
        return own.alpha * hard + (1 - own.alpha) * own.temperature**2 * soft

    def per_sample(self, outputs, targets):
        # "loss" is the hard-label cross-entropy alone: comparable with a plain classifier's val_loss and
        # test_loss, whatever the temperature and alpha
        guess = outputs.argmax(-1)
        return {
            "loss": F.cross_entropy(outputs.float(), targets[:, 0].long(), reduction="none"),
            "accuracy": (guess == targets[:, 0].long()).float(),
            "agreement": (guess == targets[:, 1:].argmax(-1)).float(),
        }

    def metrics(self, sums, count):
        return {name: value.item() / count for name, value in sums.items()}

    def example_targets(self, shape, batch):
        return torch.zeros(batch, 1 + shape.num_classes)  # class 0, a teacher that favours no class

    # --------------------------------------------------------------------------- predict: a classifier's
    def predict_inputs(self, dataset, meta, folder):
        return predict_rows(dataset, meta["input_columns"], meta["num_features"])

    def predict_batch(self, model, inputs, meta):
        best, ids = model(inputs).float().softmax(-1).max(-1)
        return [{"class_id": k, "probability": p} for k, p in zip(ids.tolist(), best.tolist())]


def with_teacher(teacher: torch.nn.Module, split: TensorPairs, classes: int) -> torch.Tensor:
    """[rows, 1 + classes]: the class id, then the teacher's logits for that row (row order kept)."""
    with torch.no_grad():
        logits = torch.cat([teacher(rows).float() for rows in split.inputs.split(1024)])
    if logits.shape != (len(split.targets), classes):
        raise ConfigError(
            f"--teacher: its model gives {tuple(logits.shape[1:])} outputs per row; this data has {classes} classes"
        )
    return torch.cat([split.targets.float().unsqueeze(1), logits], 1)
