"""Find and load the ggml shared libraries; declare every C prototype once (style C8, C9).

The libraries are built at install time by `ggml_build` into `moss_tts/ggml/_lib/` with a
`manifest.json`; `MOSS_TTS_GGML_LIB_DIR` overrides that folder. Loading happens on first use, so
`python -m moss_tts doctor` can report a missing build instead of crashing on import. This is the
declaration table of the binding (exempt from the module-size rule, C2).
"""

from __future__ import annotations

import ctypes
import json
import os
import threading
from ctypes import (POINTER, Structure, c_bool, c_char, c_char_p, c_double, c_float, c_int,
                    c_int8, c_int16, c_int32, c_int64, c_size_t, c_uint8, c_uint16, c_uint32,
                    c_uint64, c_void_p)
from pathlib import Path

from ..errors import BackendError
from .log import (ggml_abort_callback_t, ggml_log_callback, last_problem, route_ggml_abort,
                  route_ggml_log)

LIB_DIR_ENV = "MOSS_TTS_GGML_LIB_DIR"
DEFAULT_LIB_DIR = Path(__file__).resolve().parent / "_lib"
BUILD_HINT = 'rebuild with `pip install -e ".[test]"` or `python -m ggml_build`'

# ggml.h constants this binding relies on; checked against the struct layout at load time.
GGML_MAX_DIMS = 4
GGML_MAX_OP_PARAMS = 64
GGML_MAX_SRC = 10
GGML_MAX_NAME = 64


class ggml_tensor(Structure):
    """`struct ggml_tensor` (ggml.h). ggml exports no ne/nb accessors, so we read the struct."""

    _fields_ = [
        ("type", c_int),
        ("buffer", c_void_p),
        ("ne", c_int64 * GGML_MAX_DIMS),
        ("nb", c_size_t * GGML_MAX_DIMS),
        ("op", c_int),
        ("op_params", c_int32 * (GGML_MAX_OP_PARAMS // 4)),
        ("flags", c_int32),
        ("src", c_void_p * GGML_MAX_SRC),
        ("view_src", c_void_p),
        ("view_offs", c_size_t),
        ("data", c_void_p),
        ("name", c_char * GGML_MAX_NAME),
        ("extra", c_void_p),
        ("padding", c_char * 8),
    ]


class ggml_init_params(Structure):
    # struct ggml_init_params { size_t mem_size; void * mem_buffer; bool no_alloc; };
    _fields_ = [("mem_size", c_size_t), ("mem_buffer", c_void_p), ("no_alloc", c_bool)]


class gguf_init_params(Structure):
    # struct gguf_init_params { bool no_alloc; struct ggml_context ** ctx; };
    _fields_ = [("no_alloc", c_bool), ("ctx", POINTER(c_void_p))]


ggml_to_float_t = ctypes.CFUNCTYPE(None, c_void_p, POINTER(c_float), c_int64)


class ggml_type_traits(Structure):
    _fields_ = [
        ("type_name", c_char_p),
        ("blck_size", c_int64),
        ("blck_size_interleave", c_int64),
        ("type_size", c_size_t),
        ("is_quantized", c_bool),
        ("to_float", c_void_p),
        ("from_float_ref", c_void_p),
    ]


_P = c_void_p  # every opaque pointer (context, tensor, graph, backend, buffer, ...)
_T = c_void_p  # struct ggml_tensor *
_I64 = c_int64

# (name, restype, argtypes); the comment above each line is the header prototype.
DECLARATIONS: dict[str, list[tuple[str, object, list]]] = {
    "ggml.h": [
        # const char * ggml_version(void); const char * ggml_commit(void);
        ("ggml_version", c_char_p, []),
        ("ggml_commit", c_char_p, []),
        # struct ggml_context * ggml_init(struct ggml_init_params params);
        ("ggml_init", _P, [ggml_init_params]),
        # void ggml_reset(struct ggml_context * ctx); void ggml_free(struct ggml_context * ctx);
        ("ggml_reset", None, [_P]),
        ("ggml_free", None, [_P]),
        # size_t ggml_used_mem(const struct ggml_context * ctx);
        ("ggml_used_mem", c_size_t, [_P]),
        # size_t ggml_tensor_overhead(void); size_t ggml_graph_overhead_custom(size_t size, bool grads);
        ("ggml_tensor_overhead", c_size_t, []),
        ("ggml_graph_overhead_custom", c_size_t, [c_size_t, c_bool]),
        # size_t ggml_nbytes(const struct ggml_tensor * tensor);
        ("ggml_nbytes", c_size_t, [_T]),
        # int64_t ggml_nelements(const struct ggml_tensor * tensor);
        ("ggml_nelements", _I64, [_T]),
        # int64_t ggml_blck_size(enum ggml_type type); size_t ggml_type_size(enum ggml_type type);
        ("ggml_blck_size", _I64, [c_int]),
        ("ggml_type_size", c_size_t, [c_int]),
        # size_t ggml_row_size(enum ggml_type type, int64_t ne);
        ("ggml_row_size", c_size_t, [c_int, _I64]),
        # const char * ggml_type_name(enum ggml_type type); const char * ggml_op_desc(const struct ggml_tensor * t);
        ("ggml_type_name", c_char_p, [c_int]),
        ("ggml_op_desc", c_char_p, [_T]),
        # bool ggml_is_quantized(enum ggml_type type); bool ggml_is_contiguous(const struct ggml_tensor * tensor);
        ("ggml_is_quantized", c_bool, [c_int]),
        ("ggml_is_contiguous", c_bool, [_T]),
        # const struct ggml_type_traits * ggml_get_type_traits(enum ggml_type type);
        ("ggml_get_type_traits", POINTER(ggml_type_traits), [c_int]),
        # struct ggml_tensor * ggml_new_tensor(ctx, enum ggml_type type, int n_dims, const int64_t * ne);
        ("ggml_new_tensor", _T, [_P, c_int, c_int, POINTER(c_int64)]),
        # struct ggml_tensor * ggml_set_name(struct ggml_tensor * tensor, const char * name);
        ("ggml_set_name", _T, [_T, c_char_p]),
        # const char * ggml_get_name(const struct ggml_tensor * tensor);
        ("ggml_get_name", c_char_p, [_T]),
        # struct ggml_tensor * ggml_get_first_tensor / ggml_get_next_tensor (ctx[, tensor]);
        ("ggml_get_first_tensor", _T, [_P]),
        ("ggml_get_next_tensor", _T, [_P, _T]),
        # struct ggml_tensor * ggml_get_tensor(struct ggml_context * ctx, const char * name);
        ("ggml_get_tensor", _T, [_P, c_char_p]),
        # void ggml_set_input(struct ggml_tensor * tensor); void ggml_set_output(struct ggml_tensor * tensor);
        ("ggml_set_input", None, [_T]),
        ("ggml_set_output", None, [_T]),
        # binary elementwise (a, b) with broadcasting of b: ggml_add / sub / mul / div
        ("ggml_add", _T, [_P, _T, _T]),
        ("ggml_sub", _T, [_P, _T, _T]),
        ("ggml_mul", _T, [_P, _T, _T]),
        ("ggml_div", _T, [_P, _T, _T]),
        # struct ggml_tensor * ggml_scale(ctx, a, float s);
        ("ggml_scale", _T, [_P, _T, c_float]),
        # struct ggml_tensor * ggml_scale_bias(ctx, a, float s, float b);
        ("ggml_scale_bias", _T, [_P, _T, c_float, c_float]),
        # unary: ggml_sqr / sqrt / sin / tanh / exp / neg / gelu / gelu_erf / silu (ctx, a)
        ("ggml_sqr", _T, [_P, _T]),
        ("ggml_sin", _T, [_P, _T]),
        ("ggml_sqrt", _T, [_P, _T]),
        ("ggml_tanh", _T, [_P, _T]),
        ("ggml_exp", _T, [_P, _T]),
        ("ggml_neg", _T, [_P, _T]),
        ("ggml_gelu", _T, [_P, _T]),
        ("ggml_gelu_erf", _T, [_P, _T]),
        ("ggml_silu", _T, [_P, _T]),
        # struct ggml_tensor * ggml_swiglu_split(ctx, a, b);  silu(a) * b
        ("ggml_swiglu_split", _T, [_P, _T, _T]),
        # struct ggml_tensor * ggml_clamp(ctx, a, float min, float max);
        ("ggml_clamp", _T, [_P, _T, c_float, c_float]),
        # ggml_norm / ggml_rms_norm / ggml_l2_norm (ctx, a, float eps)
        ("ggml_norm", _T, [_P, _T, c_float]),
        ("ggml_rms_norm", _T, [_P, _T, c_float]),
        ("ggml_l2_norm", _T, [_P, _T, c_float]),
        # struct ggml_tensor * ggml_mul_mat(ctx, a, b);  a: [K, N], b: [K, M] -> [N, M]
        ("ggml_mul_mat", _T, [_P, _T, _T]),
        # ggml_sum_rows / ggml_argmax (ctx, a)
        ("ggml_sum_rows", _T, [_P, _T]),
        ("ggml_argmax", _T, [_P, _T]),
        # struct ggml_tensor * ggml_get_rows(ctx, a /*data*/, b /*row indices*/);
        ("ggml_get_rows", _T, [_P, _T, _T]),
        # struct ggml_tensor * ggml_set_rows(ctx, a /*destination*/, b /*source*/, c /*row indices*/);
        ("ggml_set_rows", _T, [_P, _T, _T, _T]),
        # struct ggml_tensor * ggml_cpy(ctx, a, b);  copy a into b (a view), returns the view of b
        ("ggml_cpy", _T, [_P, _T, _T]),
        # struct ggml_tensor * ggml_cast(ctx, a, enum ggml_type type);
        ("ggml_cast", _T, [_P, _T, c_int]),
        # struct ggml_tensor * ggml_cont(ctx, a);
        ("ggml_cont", _T, [_P, _T]),
        # struct ggml_tensor * ggml_reshape_4d(ctx, a, int64_t ne0..ne3);
        ("ggml_reshape_4d", _T, [_P, _T, _I64, _I64, _I64, _I64]),
        # struct ggml_tensor * ggml_view_4d(ctx, a, ne0, ne1, ne2, ne3, size_t nb1, nb2, nb3, offset);
        ("ggml_view_4d", _T, [_P, _T, _I64, _I64, _I64, _I64, c_size_t, c_size_t, c_size_t, c_size_t]),
        # struct ggml_tensor * ggml_permute(ctx, a, int axis0, int axis1, int axis2, int axis3);
        ("ggml_permute", _T, [_P, _T, c_int, c_int, c_int, c_int]),
        # struct ggml_tensor * ggml_transpose(ctx, a);
        ("ggml_transpose", _T, [_P, _T]),
        # struct ggml_tensor * ggml_concat(ctx, a, b, int dim);
        ("ggml_concat", _T, [_P, _T, _T, c_int]),
        # struct ggml_tensor * ggml_pad_ext(ctx, a, int lp0, int rp0, lp1, rp1, lp2, rp2, lp3, rp3);
        ("ggml_pad_ext", _T, [_P, _T] + [c_int] * 8),
        # struct ggml_tensor * ggml_soft_max_ext(ctx, a, mask, float scale, float max_bias);
        ("ggml_soft_max_ext", _T, [_P, _T, _T, c_float, c_float]),
        # struct ggml_tensor * ggml_rope_ext(ctx, a, b /*positions*/, c /*freq factors*/, int n_dims,
        #     int mode, int n_ctx_orig, float freq_base, float freq_scale, float ext_factor,
        #     float attn_factor, float beta_fast, float beta_slow);
        ("ggml_rope_ext", _T, [_P, _T, _T, _T, c_int, c_int, c_int] + [c_float] * 6),
        # struct ggml_tensor * ggml_flash_attn_ext(ctx, q, k, v, mask, float scale, float max_bias,
        #     float logit_softcap);
        ("ggml_flash_attn_ext", _T, [_P, _T, _T, _T, _T, c_float, c_float, c_float]),
        # void ggml_flash_attn_ext_set_prec(struct ggml_tensor * a, enum ggml_prec prec);
        ("ggml_flash_attn_ext_set_prec", None, [_T, c_int]),
        # struct ggml_cgraph * ggml_new_graph_custom(struct ggml_context * ctx, size_t size, bool grads);
        ("ggml_new_graph_custom", _P, [_P, c_size_t, c_bool]),
        # void ggml_build_forward_expand(struct ggml_cgraph * cgraph, struct ggml_tensor * tensor);
        ("ggml_build_forward_expand", None, [_P, _T]),
        # int ggml_graph_size(struct ggml_cgraph * cgraph);
        ("ggml_graph_size", c_int, [_P]),
        # int ggml_graph_n_nodes(struct ggml_cgraph * cgraph);
        ("ggml_graph_n_nodes", c_int, [_P]),
        # struct ggml_tensor * ggml_graph_node(struct ggml_cgraph * cgraph, int i);
        ("ggml_graph_node", _T, [_P, c_int]),
        # size_t ggml_quantize_chunk(enum ggml_type type, const float * src, void * dst, int64_t start,
        #     int64_t nrows, int64_t n_per_row, const float * imatrix);
        ("ggml_quantize_chunk", c_size_t, [c_int, c_void_p, c_void_p, _I64, _I64, _I64, c_void_p]),
        # bool ggml_quantize_requires_imatrix(enum ggml_type type);
        ("ggml_quantize_requires_imatrix", c_bool, [c_int]),
        # void ggml_log_set(ggml_log_callback log_callback, void * user_data);
        ("ggml_log_set", None, [ggml_log_callback, c_void_p]),
        # ggml_abort_callback_t ggml_set_abort_callback(ggml_abort_callback_t callback);
        ("ggml_set_abort_callback", c_void_p, [ggml_abort_callback_t]),
    ],
    "ggml-alloc.h": [
        # ggml_gallocr_t ggml_gallocr_new(ggml_backend_buffer_type_t buft);
        ("ggml_gallocr_new", _P, [_P]),
        # void ggml_gallocr_free(ggml_gallocr_t galloc);
        ("ggml_gallocr_free", None, [_P]),
        # bool ggml_gallocr_reserve(ggml_gallocr_t galloc, struct ggml_cgraph * graph);
        ("ggml_gallocr_reserve", c_bool, [_P, _P]),
        # bool ggml_gallocr_alloc_graph(ggml_gallocr_t galloc, struct ggml_cgraph * graph);
        ("ggml_gallocr_alloc_graph", c_bool, [_P, _P]),
        # size_t ggml_gallocr_get_buffer_size(ggml_gallocr_t galloc, int buffer_id);
        ("ggml_gallocr_get_buffer_size", c_size_t, [_P, c_int]),
        # struct ggml_backend_buffer * ggml_backend_alloc_ctx_tensors(struct ggml_context * ctx, ggml_backend_t backend);
        ("ggml_backend_alloc_ctx_tensors", _P, [_P, _P]),
    ],
    "ggml-backend.h": [
        # const char * ggml_backend_name(ggml_backend_t backend); void ggml_backend_free(ggml_backend_t backend);
        ("ggml_backend_name", c_char_p, [_P]),
        ("ggml_backend_free", None, [_P]),
        # ggml_backend_buffer_type_t ggml_backend_get_default_buffer_type(ggml_backend_t backend);
        ("ggml_backend_get_default_buffer_type", _P, [_P]),
        # ggml_backend_dev_t ggml_backend_get_device(ggml_backend_t backend);
        ("ggml_backend_get_device", _P, [_P]),
        # ggml_backend_buffer_t ggml_backend_alloc_buffer(ggml_backend_t backend, size_t size);
        ("ggml_backend_alloc_buffer", _P, [_P, c_size_t]),
        # void ggml_backend_buffer_free(ggml_backend_buffer_t buffer);
        ("ggml_backend_buffer_free", None, [_P]),
        # void * ggml_backend_buffer_get_base(ggml_backend_buffer_t buffer);
        ("ggml_backend_buffer_get_base", c_void_p, [_P]),
        # size_t ggml_backend_buffer_get_size(ggml_backend_buffer_t buffer);
        ("ggml_backend_buffer_get_size", c_size_t, [_P]),
        # bool ggml_backend_buffer_is_host(ggml_backend_buffer_t buffer);
        ("ggml_backend_buffer_is_host", c_bool, [_P]),
        # void ggml_backend_buffer_clear(ggml_backend_buffer_t buffer, uint8_t value);
        ("ggml_backend_buffer_clear", None, [_P, c_uint8]),
        # void ggml_backend_buffer_set_usage(ggml_backend_buffer_t buffer, enum ggml_backend_buffer_usage usage);
        ("ggml_backend_buffer_set_usage", None, [_P, c_int]),
        # size_t ggml_backend_buft_get_alignment(ggml_backend_buffer_type_t buft);
        ("ggml_backend_buft_get_alignment", c_size_t, [_P]),
        # bool ggml_backend_buft_is_host(ggml_backend_buffer_type_t buft);
        ("ggml_backend_buft_is_host", c_bool, [_P]),
        # const char * ggml_backend_buft_name(ggml_backend_buffer_type_t buft);
        ("ggml_backend_buft_name", c_char_p, [_P]),
        # ggml_backend_buffer_t ggml_backend_buft_alloc_buffer(ggml_backend_buffer_type_t buft,
        #                                                      size_t size);
        ("ggml_backend_buft_alloc_buffer", _P, [_P, c_size_t]),
        # void ggml_backend_tensor_set(struct ggml_tensor * tensor, const void * data, size_t offset, size_t size);
        ("ggml_backend_tensor_set", None, [_T, c_void_p, c_size_t, c_size_t]),
        # void ggml_backend_tensor_get(const struct ggml_tensor * tensor, void * data, size_t offset, size_t size);
        ("ggml_backend_tensor_get", None, [_T, c_void_p, c_size_t, c_size_t]),
        # void ggml_backend_tensor_memset(struct ggml_tensor * tensor, uint8_t value, size_t offset, size_t size);
        ("ggml_backend_tensor_memset", None, [_T, c_uint8, c_size_t, c_size_t]),
        # enum ggml_status ggml_backend_graph_compute(ggml_backend_t backend, struct ggml_cgraph * cgraph);
        ("ggml_backend_graph_compute", c_int, [_P, _P]),
        # void ggml_backend_synchronize(ggml_backend_t backend);
        ("ggml_backend_synchronize", None, [_P]),
        # bool ggml_backend_supports_op(ggml_backend_t backend, const struct ggml_tensor * op);
        ("ggml_backend_supports_op", c_bool, [_P, _T]),
        # enum ggml_status ggml_backend_tensor_alloc(ggml_backend_buffer_t buffer, struct ggml_tensor * tensor, void * addr);
        ("ggml_backend_tensor_alloc", c_int, [_P, _T, c_void_p]),
        # ggml_backend_buffer_t ggml_backend_cpu_buffer_from_ptr(void * ptr, size_t size);
        ("ggml_backend_cpu_buffer_from_ptr", _P, [c_void_p, c_size_t]),
        # size_t ggml_backend_dev_count(void); ggml_backend_dev_t ggml_backend_dev_get(size_t index);
        ("ggml_backend_dev_count", c_size_t, []),
        ("ggml_backend_dev_get", _P, [c_size_t]),
        # const char * ggml_backend_dev_name(ggml_backend_dev_t device); ... _description(device);
        ("ggml_backend_dev_name", c_char_p, [_P]),
        ("ggml_backend_dev_description", c_char_p, [_P]),
        # enum ggml_backend_dev_type ggml_backend_dev_type(ggml_backend_dev_t device);
        ("ggml_backend_dev_type", c_int, [_P]),
        # void ggml_backend_dev_memory(ggml_backend_dev_t device, size_t * free, size_t * total);
        ("ggml_backend_dev_memory", None, [_P, POINTER(c_size_t), POINTER(c_size_t)]),
        # ggml_backend_t ggml_backend_dev_init(ggml_backend_dev_t device, const char * params);
        ("ggml_backend_dev_init", _P, [_P, c_char_p]),
        # ggml_backend_reg_t ggml_backend_dev_backend_reg(ggml_backend_dev_t device);
        ("ggml_backend_dev_backend_reg", _P, [_P]),
        # const char * ggml_backend_reg_name(ggml_backend_reg_t reg);
        ("ggml_backend_reg_name", c_char_p, [_P]),
        # void * ggml_backend_reg_get_proc_address(ggml_backend_reg_t reg, const char * name);
        ("ggml_backend_reg_get_proc_address", c_void_p, [_P, c_char_p]),
        # size_t ggml_backend_reg_dev_count(ggml_backend_reg_t reg);
        ("ggml_backend_reg_dev_count", c_size_t, [_P]),
        # ggml_backend_dev_t ggml_backend_reg_dev_get(ggml_backend_reg_t reg, size_t index);
        ("ggml_backend_reg_dev_get", _P, [_P, c_size_t]),
        # ggml_backend_dev_t ggml_backend_dev_by_type(enum ggml_backend_dev_type type);
        ("ggml_backend_dev_by_type", _P, [c_int]),
        # ggml_backend_sched_t ggml_backend_sched_new(ggml_backend_t * backends,
        #     ggml_backend_buffer_type_t * bufts, int n_backends, size_t graph_size, bool parallel,
        #     bool op_offload);
        ("ggml_backend_sched_new", _P, [POINTER(c_void_p), c_void_p, c_int, c_size_t, c_bool,
                                        c_bool]),
        # void ggml_backend_sched_free(ggml_backend_sched_t sched);
        ("ggml_backend_sched_free", None, [_P]),
        # bool ggml_backend_sched_reserve(ggml_backend_sched_t sched, struct ggml_cgraph * measure_graph);
        ("ggml_backend_sched_reserve", c_bool, [_P, _P]),
        # void ggml_backend_sched_reset(ggml_backend_sched_t sched);
        ("ggml_backend_sched_reset", None, [_P]),
        # bool ggml_backend_sched_alloc_graph(ggml_backend_sched_t sched, struct ggml_cgraph * graph);
        ("ggml_backend_sched_alloc_graph", c_bool, [_P, _P]),
        # enum ggml_status ggml_backend_sched_graph_compute(ggml_backend_sched_t sched, struct ggml_cgraph * graph);
        ("ggml_backend_sched_graph_compute", c_int, [_P, _P]),
        # int ggml_backend_sched_get_n_splits(ggml_backend_sched_t sched);
        ("ggml_backend_sched_get_n_splits", c_int, [_P]),
        # size_t ggml_backend_sched_get_buffer_size(ggml_backend_sched_t sched, ggml_backend_t backend);
        ("ggml_backend_sched_get_buffer_size", c_size_t, [_P, _P]),
        # void ggml_backend_sched_set_tensor_backend(ggml_backend_sched_t sched, struct ggml_tensor * node, ggml_backend_t backend);
        ("ggml_backend_sched_set_tensor_backend", None, [_P, _T, _P]),
        # ggml_backend_t ggml_backend_sched_get_tensor_backend(ggml_backend_sched_t sched, struct ggml_tensor * node);
        ("ggml_backend_sched_get_tensor_backend", _P, [_P, _T]),
    ],
    # Present only in a build with MOSS_TTS_GGML_RPC=1 (OPTIONAL_GROUPS).
    "ggml-rpc.h": [
        # ggml_backend_t ggml_backend_rpc_init(const char * endpoint, uint32_t device);
        ("ggml_backend_rpc_init", _P, [c_char_p, c_uint32]),
        # bool ggml_backend_is_rpc(ggml_backend_t backend);
        ("ggml_backend_is_rpc", c_bool, [_P]),
        # ggml_backend_reg_t ggml_backend_rpc_add_server(const char * endpoint);
        ("ggml_backend_rpc_add_server", _P, [c_char_p]),
        # void ggml_backend_rpc_start_server(const char * endpoint, const char * cache_dir,
        #     size_t n_threads, size_t n_devices, ggml_backend_dev_t * devices);
        ("ggml_backend_rpc_start_server", None, [c_char_p, c_char_p, c_size_t, c_size_t,
                                                 POINTER(c_void_p)]),
    ],
    "ggml-cpu.h": [
        # void ggml_backend_cpu_set_n_threads(ggml_backend_t backend_cpu, int n_threads);
        ("ggml_backend_cpu_set_n_threads", None, [_P, c_int]),
        # bool ggml_backend_is_cpu(ggml_backend_t backend);
        ("ggml_backend_is_cpu", c_bool, [_P]),
        # int ggml_cpu_has_<feature>(void);
        *[(f"ggml_cpu_has_{f}", c_int, []) for f in (
            "sse3", "ssse3", "avx", "avx_vnni", "avx2", "bmi2", "f16c", "fma", "avx512",
            "avx512_vbmi", "avx512_vnni", "avx512_bf16", "amx_int8", "neon", "arm_fma",
            "fp16_va", "dotprod", "matmul_int8", "sve", "llamafile")],
    ],
    "gguf.h": [
        # struct gguf_context * gguf_init_from_file(const char * fname, struct gguf_init_params params);
        ("gguf_init_from_file", _P, [c_char_p, gguf_init_params]),
        # void gguf_free(struct gguf_context * ctx);
        ("gguf_free", None, [_P]),
        # uint32_t gguf_get_version(ctx); size_t gguf_get_alignment(ctx); size_t gguf_get_data_offset(ctx);
        ("gguf_get_version", c_uint32, [_P]),
        ("gguf_get_alignment", c_size_t, [_P]),
        ("gguf_get_data_offset", c_size_t, [_P]),
        # int64_t gguf_get_n_kv(ctx); int64_t gguf_find_key(ctx, const char * key);
        ("gguf_get_n_kv", _I64, [_P]),
        ("gguf_find_key", _I64, [_P, c_char_p]),
        # const char * gguf_get_key(ctx, int64_t key_id);
        ("gguf_get_key", c_char_p, [_P, _I64]),
        # enum gguf_type gguf_get_kv_type(ctx, key_id); enum gguf_type gguf_get_arr_type(ctx, key_id);
        ("gguf_get_kv_type", c_int, [_P, _I64]),
        ("gguf_get_arr_type", c_int, [_P, _I64]),
        # <T> gguf_get_val_<t>(ctx, key_id);
        ("gguf_get_val_u8", c_uint8, [_P, _I64]),
        ("gguf_get_val_i8", c_int8, [_P, _I64]),
        ("gguf_get_val_u16", c_uint16, [_P, _I64]),
        ("gguf_get_val_i16", c_int16, [_P, _I64]),
        ("gguf_get_val_u32", c_uint32, [_P, _I64]),
        ("gguf_get_val_i32", c_int32, [_P, _I64]),
        ("gguf_get_val_f32", c_float, [_P, _I64]),
        ("gguf_get_val_u64", c_uint64, [_P, _I64]),
        ("gguf_get_val_i64", c_int64, [_P, _I64]),
        ("gguf_get_val_f64", c_double, [_P, _I64]),
        ("gguf_get_val_bool", c_bool, [_P, _I64]),
        ("gguf_get_val_str", c_char_p, [_P, _I64]),
        # size_t gguf_get_arr_n(ctx, key_id); const void * gguf_get_arr_data(ctx, key_id);
        ("gguf_get_arr_n", c_size_t, [_P, _I64]),
        ("gguf_get_arr_data", c_void_p, [_P, _I64]),
        # const char * gguf_get_arr_str(ctx, key_id, size_t i);
        ("gguf_get_arr_str", c_char_p, [_P, _I64, c_size_t]),
        # int64_t gguf_get_n_tensors(ctx); int64_t gguf_find_tensor(ctx, const char * name);
        ("gguf_get_n_tensors", _I64, [_P]),
        ("gguf_find_tensor", _I64, [_P, c_char_p]),
        # size_t gguf_get_tensor_offset(ctx, tensor_id); const char * gguf_get_tensor_name(ctx, tensor_id);
        ("gguf_get_tensor_offset", c_size_t, [_P, _I64]),
        ("gguf_get_tensor_name", c_char_p, [_P, _I64]),
        # enum ggml_type gguf_get_tensor_type(ctx, tensor_id); size_t gguf_get_tensor_size(ctx, tensor_id);
        ("gguf_get_tensor_type", c_int, [_P, _I64]),
        ("gguf_get_tensor_size", c_size_t, [_P, _I64]),
    ],
}


# Header groups of a backend the build may leave out: header → the manifest's backend name. Its
# functions are bound only when the manifest lists that backend (then all must be there).
OPTIONAL_GROUPS = {"ggml-rpc.h": "rpc"}


class Lib:
    """The loaded libraries: each declared C function is an attribute of the same name."""

    def __init__(self, lib_dir: Path, manifest: dict, handles: list):
        self.lib_dir = lib_dir
        self.manifest = manifest
        self._handles = handles
        self.backends = {str(b).lower() for b in manifest.get("backends", ())}
        # what ggml logged while registering the backends (None: nothing), e.g. a CUDA build on
        # a machine without a GPU or driver: "ggml_cuda_init: failed to initialize CUDA: ..."
        self.registration_problem: str | None = None
        missing = []
        for header, group in DECLARATIONS.items():
            needs = OPTIONAL_GROUPS.get(header)
            if needs is not None and needs not in self.backends:
                continue
            for name, restype, argtypes in group:
                fn = _find_symbol(handles, name)
                if fn is None:
                    missing.append(name)
                    continue
                fn.restype = restype
                fn.argtypes = argtypes
                setattr(self, name, fn)
        if missing:
            raise BackendError(
                f"ggml in {lib_dir} lacks {len(missing)} symbol(s) this binding needs "
                f"({', '.join(missing[:5])}...): it is not the pinned ggml — {BUILD_HINT}")


def _find_symbol(handles, name):
    for h in handles:
        try:
            return getattr(h, name)
        except AttributeError:
            continue
    return None


_lock = threading.Lock()
_loaded: Lib | None = None


def lib_dir() -> Path:
    """The folder the libraries are loaded from (env override first, then the install)."""
    override = os.environ.get(LIB_DIR_ENV)
    return Path(override) if override else DEFAULT_LIB_DIR


def read_manifest(directory: Path | None = None) -> dict:
    directory = directory or lib_dir()
    path = directory / "manifest.json"
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise BackendError(f"ggml build manifest not found at {path} — {BUILD_HINT}") from None
    except (OSError, ValueError) as e:
        raise BackendError(f"ggml build manifest {path} is unreadable ({e}) — {BUILD_HINT}") from None


def get() -> Lib:
    """Load the libraries once (thread-safe) and return the declared functions."""
    global _loaded
    if _loaded is not None:
        return _loaded
    with _lock:
        if _loaded is None:
            _loaded = _load()
    return _loaded


def _load() -> Lib:
    directory = lib_dir()
    manifest = read_manifest(directory)
    names = manifest.get("libraries") or []
    if not names:
        raise BackendError(f"ggml manifest in {directory} lists no libraries — {BUILD_HINT}")
    handles, tried = [], []
    for name in names:
        path = directory / name
        tried.append(str(path))
        try:
            # RTLD_GLOBAL: libggml.so resolves the base and backend symbols loaded before it.
            handles.append(ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL))
        except OSError as e:
            raise BackendError(
                f"cannot load ggml library {path} ({e}); tried {', '.join(tried)} — "
                f"{_load_hint(name)}") from None
    lib = Lib(directory, manifest, handles)
    _check_tensor_layout(lib)
    route_ggml_log(lib)
    route_ggml_abort(lib)
    # Register the backends now, before anything else logs: a GPU backend with no device here
    # logs why once, at registration; kept apart, it is said where the missing device is asked
    # for (doctor, --backend) and is never taken for the cause of a later, unrelated failure.
    lib.ggml_backend_dev_count()
    lib.registration_problem = last_problem()
    return lib


def _load_hint(name: str) -> str:
    """The fix when library `name` will not load. A GPU backend's library (libggml-cuda.so)
    needs its toolkit's runtime (libcudart, libcublas) at load time, and libggml.so links every
    backend built (GGML_BACKEND_DL=OFF), so without that runtime nothing loads, not even the CPU."""
    stem = name.split(".")[0].removeprefix("lib")
    backend = stem[len("ggml-"):] if stem.startswith("ggml-") else ""
    if backend in ("", "base", "cpu", "rpc"):
        return BUILD_HINT
    return (f"this build has the {backend} backend, whose runtime libraries this machine lacks or "
            f"cannot find: put their folder on LD_LIBRARY_PATH, or rebuild ggml without it "
            f"(`MOSS_TTS_GGML_{backend.upper()}=0 python -m ggml_build`; docs/build.md)")


def _check_tensor_layout(lib: Lib) -> None:
    """Verify our `ggml_tensor` mirror against ggml's own accessors before anything trusts it."""
    ctx = lib.ggml_init(ggml_init_params(lib.ggml_tensor_overhead() * 4, None, False))
    if not ctx:
        raise BackendError("ggml_init failed during the layout check")
    try:
        ne = (c_int64 * 4)(3, 5, 7, 1)
        p = lib.ggml_new_tensor(ctx, 0, 3, ne)  # f32 [3, 5, 7]
        lib.ggml_set_name(p, b"layout.check")
        t = ggml_tensor.from_address(p)
        expect_nb = (4, 12, 60, 420)
        ok = (tuple(t.ne) == (3, 5, 7, 1) and tuple(t.nb) == expect_nb and t.type == 0
              and t.name == b"layout.check" and lib.ggml_get_name(p) == b"layout.check"
              and lib.ggml_nbytes(p) == 420 and lib.ggml_nelements(p) == 105 and t.data)
        if not ok:
            raise BackendError(
                f"struct ggml_tensor layout of the loaded ggml ({lib.ggml_version().decode()}) does "
                f"not match this binding (ne={tuple(t.ne)}, nb={tuple(t.nb)}) — {BUILD_HINT}")
    finally:
        lib.ggml_free(ctx)


def cpu_features(lib: Lib) -> list[str]:
    """CPU features the ggml CPU backend was compiled for and detects."""
    return [name[len("ggml_cpu_has_"):] for name, _, _ in DECLARATIONS["ggml-cpu.h"]
            if name.startswith("ggml_cpu_has_") and getattr(lib, name)()]
