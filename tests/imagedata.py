"""Image datasets generated for the tests: the bundled 8x8 digits drawn as PNG files (an
imagefolder, one subfolder per class) or as a parquet file with an Image column."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PIL import Image

DIGITS = Path(__file__).resolve().parents[1] / "src" / "anytrain" / "data" / "digits.parquet"


def digit_images(
    size: int = 16, mode: str = "L", count: int | None = None, seed: int = 0
) -> tuple[list[Image.Image], list[int]]:
    """The digits (values 0..16) scaled to 0..255 and resized to size x size; RGB ones get a random tint each."""
    import datasets

    ds = datasets.Dataset.from_parquet(str(DIGITS))
    rows = ds.with_format("numpy")[: count or len(ds)]
    rng = np.random.default_rng(seed)
    images = []
    for pixels in rows["pixels"]:
        gray = (pixels.reshape(8, 8).astype(np.float64) * (255 / 16)).round().astype(np.uint8)
        image = Image.fromarray(gray, "L").resize((size, size), Image.Resampling.BILINEAR)
        if mode == "RGB":
            tint = rng.uniform(0.3, 1.0, size=3)
            image = Image.fromarray((np.asarray(image)[..., None] * tint).round().astype(np.uint8), "RGB")
        images.append(image)
    return images, [int(v) for v in rows["label"]]


def write_imagefolder(
    folder: Path, size: int = 16, mode: str = "L", count: int | None = None, sizes: tuple[int, ...] | None = None
) -> Path:
    """folder/<label>/<i>.png; with `sizes`, image i is drawn at sizes[i % len(sizes)] (mixed sizes)."""
    images, labels = digit_images(size, mode, count)
    for i, (image, label) in enumerate(zip(images, labels)):
        if sizes:
            image = image.resize((sizes[i % len(sizes)],) * 2, Image.Resampling.BILINEAR)
        path = folder / str(label) / f"{i:04d}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        image.save(path)
    return folder


def write_image_parquet(path: Path, size: int = 16, mode: str = "L", count: int | None = None) -> Path:
    """A parquet file with an Image column `image` (PNG bytes) and a ClassLabel column `label`."""
    import datasets

    images, labels = digit_images(size, mode, count)
    blobs = []
    for image in images:
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        blobs.append({"bytes": buffer.getvalue(), "path": None})
    features = datasets.Features(
        {"image": datasets.Image(), "label": datasets.ClassLabel(names=[str(d) for d in range(10)])}
    )
    datasets.Dataset.from_dict({"image": blobs, "label": labels}, features=features).to_parquet(str(path))
    return path
