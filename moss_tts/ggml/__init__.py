"""The ggml binding: the only package that imports ctypes (style C7)."""

from .backend import Allocator, Backend, Buffer, default_threads, devices, get_backend
from .sched import allocator_for
from .graph import Graph, Tensor
from .types import BF16, F16, F32, I32, I64, GGMLType
from . import repack
from .weights import GGUFFile, TensorInfo, TensorStore, Weights
from .work import Work, count_flops

__all__ = ["Allocator", "allocator_for", "Backend", "Buffer", "default_threads", "devices", "get_backend", "Graph",
           "Tensor", "GGMLType", "F32", "F16", "BF16", "I32", "I64", "GGUFFile", "TensorInfo",
           "Weights", "TensorStore", "Work", "count_flops"]
