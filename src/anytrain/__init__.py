"""anytrain: one plain PyTorch training loop that runs unchanged wherever `accelerate launch` puts it."""

from .api import train
from .config import TrainConfig
from .outputs import load_model
from .shape import DataShape

__all__ = ["DataShape", "TrainConfig", "load_model", "train"]
__version__ = "0.1.0"
