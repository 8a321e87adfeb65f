"""Produce src/anytrain/data/digits.parquet, the dataset anytrain trains on by default.

Run once by a maintainer (needs scikit-learn, which is NOT a runtime dependency):

    pip install scikit-learn && python scripts/make_digits.py

The source is the copy of the UCI "Optical Recognition of Handwritten Digits" test set
that scikit-learn ships (sklearn/datasets/data/digits.csv.gz): 1,797 images of 8x8
integer pixels in 0..16, labels 0..9. Licence: CC BY 4.0 (see DIGITS_SOURCE.md).
"""

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from sklearn.datasets import load_digits

OUT = Path(__file__).resolve().parents[1] / "src" / "anytrain" / "data" / "digits.parquet"


def main() -> None:
    digits = load_digits()
    pixels = digits.data.astype(np.uint8)  # 0..16 fits in a byte
    table = pa.table(
        {
            "pixels": pa.array(list(pixels), type=pa.list_(pa.uint8(), 64)),
            "label": pa.array(digits.target.astype(np.int64)),
        }
    )
    pq.write_table(table, OUT, compression="zstd")
    print(f"wrote {OUT} ({table.num_rows} rows, {OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
