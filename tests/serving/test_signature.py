"""Dtype names as TensorFlow's own messages print them."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from serving.signature import tf_type_name


@pytest.mark.parametrize(
    ("dtype", "name"),
    [
        (np.float32, "float"),
        (np.float64, "double"),
        (np.float16, "half"),
        (ml_dtypes.bfloat16, "bfloat16"),
        (np.int32, "int32"),
        (np.int64, "int64"),
        (np.uint8, "uint8"),
        (np.bool_, "bool"),
        (object, "string"),
        ("<U3", "string"),
        (">f4", "float"),
        (np.complex64, "complex64"),
    ],
)
def test_tf_type_name_is_tensorflows_data_type_string(dtype: object, name: str) -> None:
    assert tf_type_name(np.dtype(dtype)) == name


def test_tf_type_name_of_a_type_tensorflow_lacks_is_numpys() -> None:
    assert tf_type_name(np.dtype("datetime64[s]")) == "datetime64[s]"
