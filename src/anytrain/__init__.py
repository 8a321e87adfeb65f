"""anytrain: one plain PyTorch training loop that runs unchanged wherever `accelerate launch` puts it."""

from .config import TrainConfig
from .outputs import load_model

__all__ = ["TrainConfig", "load_model"]
__version__ = "0.1.0"
