#!/usr/bin/python3
"""Exports scikit-learn's handwritten digits (python3-sklearn ships them) as
.npy image sets for the convolutional tests: uint8 N x 8 x 8 x 1 images
(sklearn's 0..16 intensities scaled to 0..255) and int32 class ids.

A fixed stratified split: 1437 training images (digits_train_x.npy,
digits_train_y.npy) and 360 test images (digits_test_x.npy,
digits_test_y.npy); the test images are never used for tuning.

    /usr/bin/python3 tests/data/make_digits.py           # writes the files here
    /usr/bin/python3 tests/data/make_digits.py --check   # compares instead
"""
import os
import sys

import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    d = load_digits()
    images = np.minimum(d.images * 16, 255).astype(np.uint8)[..., None]  # N x 8 x 8 x 1
    labels = d.target.astype(np.int32)
    xtr, xte, ytr, yte = train_test_split(images, labels, test_size=360, random_state=0,
                                          stratify=labels)
    files = {"digits_train_x.npy": xtr, "digits_train_y.npy": ytr,
             "digits_test_x.npy": xte, "digits_test_y.npy": yte}
    ok = True
    for name, arr in files.items():
        path = os.path.join(HERE, name)
        if "--check" in sys.argv:
            same = os.path.exists(path) and np.array_equal(np.load(path), arr)
            print(f"{name}: {'up to date' if same else 'differs'}")
            ok = ok and same
        else:
            np.save(path, np.ascontiguousarray(arr))
            print(f"wrote {path} {arr.dtype} {arr.shape}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
