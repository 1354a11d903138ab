/*
 * rapidmoe.h - the whole public C API of the rapidmoe runtime.
 *
 * Conventions, stated once and followed everywhere:
 *   - Every fallible call returns rm_status (RM_OK == 0, errors < 0). The detail goes into a
 *     thread-local message read with rm_last_error(): the function, the object and the value.
 *     Bad input never aborts the process.
 *   - The library frees what it allocates: rm_X_open/rm_X_load pair with rm_X_close/rm_X_free,
 *     and those accept NULL.
 *   - Bulk outputs go into caller buffers given as (pointer, capacity).
 *   - Strings returned as rm_str point into memory owned by the handle (for GGUF files, into the
 *     file mapping); they are not NUL-terminated and stay valid until the handle is closed.
 *   - Shapes are in ggml `ne` order: ne[0] is the fastest-varying dimension (a row).
 *
 * The text between RM_CDEF_BEGIN and RM_CDEF_END is read by the Python binding's cffi builder
 * as is (preprocessor lines excepted), so it stays plain C declarations.
 */
#ifndef RAPIDMOE_H
#define RAPIDMOE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The library is built with hidden visibility; what this header declares is its exported API. */
#if defined(__GNUC__)
#pragma GCC visibility push(default)
#endif

/* RM_CDEF_BEGIN */

/* Bumped whenever a declaration below changes; the Python layer refuses a library that differs. */
#define RM_ABI_VERSION 10

typedef enum rm_status {
    RM_OK                  =  0,
    RM_E_IO                = -1,  /* open/read/mmap failed */
    RM_E_FORMAT            = -2,  /* malformed file or data */
    RM_E_UNSUPPORTED_TYPE  = -3,  /* a ggml type this build does not handle */
    RM_E_UNSUPPORTED_ARCH  = -4,  /* a model architecture this build does not handle */
    RM_E_SHAPE             = -5,  /* tensor shapes that do not fit together */
    RM_E_OOM               = -6,  /* allocation failed */
    RM_E_INVALID_ARG       = -7,  /* a bad argument from the caller */
    RM_E_CUDA              = -8,  /* a CUDA error, or no usable GPU */
    RM_E_STATE             = -9,  /* a call that the object's state does not allow (none of the five below) */
    RM_E_INTERNAL          = -10,
    /* the states a call can find its object in, one code each so a caller can say which */
    RM_E_CONTEXT_FULL      = -11, /* the tokens do not fit in the session's context */
    RM_E_NO_RESIDUAL       = -12, /* needs a residual sidecar, and the model was loaded without one */
    RM_E_NEEDS_CPU         = -13, /* runs on the CPU backend only, and the session runs on a device */
    RM_E_NOT_CALIBRATING   = -14, /* reads what is recorded only while calibrating */
    RM_E_NO_BUDGET         = -15  /* the session's residual policy has no budget to adjust */
} rm_status;

uint32_t     rm_abi_version(void);
const char * rm_last_error(void);              /* "" when the last call on this thread succeeded */
const char * rm_status_str(rm_status status);  /* "RM_E_FORMAT", ... */
const char * rm_build_info(void);              /* compiler, ISA paths compiled in, CUDA on/off */

/* A byte string that points into memory owned by a handle. Not NUL-terminated. */
typedef struct rm_str {
    const char * ptr;
    uint64_t     len;
} rm_str;

/* ---------------------------------------------------------------------------------------------
 * ggml block-quantized types (ids as in ggml's enum ggml_type)
 * ------------------------------------------------------------------------------------------- */

typedef enum rm_type {
    RM_TYPE_F32  = 0,
    RM_TYPE_F16  = 1,
    RM_TYPE_Q4_0 = 2,
    RM_TYPE_Q4_1 = 3,
    RM_TYPE_Q5_0 = 6,
    RM_TYPE_Q5_1 = 7,
    RM_TYPE_Q8_0 = 8,
    RM_TYPE_Q8_1 = 9,
    RM_TYPE_Q2_K = 10,
    RM_TYPE_Q3_K = 11,
    RM_TYPE_Q4_K = 12,
    RM_TYPE_Q5_K = 13,
    RM_TYPE_Q6_K = 14,
    RM_TYPE_Q8_K = 15,
    RM_TYPE_IQ2_XXS = 16,
    RM_TYPE_IQ2_XS  = 17,
    RM_TYPE_IQ3_XXS = 18,
    RM_TYPE_IQ1_S   = 19,
    RM_TYPE_IQ4_NL  = 20,
    RM_TYPE_IQ3_S   = 21,
    RM_TYPE_IQ2_S   = 22,
    RM_TYPE_IQ4_XS  = 23,
    RM_TYPE_I32     = 26,         /* integers: tables, not weights (DeepSeek-V4's tid2eid) */
    RM_TYPE_IQ1_M   = 29,
    RM_TYPE_BF16 = 30,
    RM_TYPE_MXFP4 = 39,
    RM_TYPE_COUNT = 43            /* one past the largest id ggml knows */
} rm_type;

typedef struct rm_type_info {
    const char * name;            /* as gguf spells it: "Q4_K" */
    int32_t      block_elems;     /* elements per block (1 for plain floats) */
    int32_t      block_bytes;     /* bytes per block */
    int32_t      is_quantized;
    int32_t      vec_dot_type;    /* the activation type this type dots against */
    int32_t      can_quantize;    /* a reference quantizer exists */
    int32_t      implemented;     /* the CPU computes with it (dequantize, dot, matmul) */
    int32_t      cuda_matmul_chunk; /* the CUDA kernels multiply by it (rows a multiple of this
                                     * many elements), in every build, CUDA or not; 0: they do not */
    int32_t      takes_importance; /* rm_quantize_weighted accepts an importance for it */
} rm_type_info;

/* The types this build computes with. RM_E_UNSUPPORTED_TYPE for the others (the message names
 * the id); rm_type_describe_any then still gives the name and block geometry. */
rm_status rm_type_describe(int32_t type, rm_type_info * out);

/* Any type ggml has an id for, as the GGUF reader sizes its tensors: the one type table serves
 * both. RM_E_UNSUPPORTED_TYPE for an id ggml removed, RM_E_INVALID_ARG out of [0, RM_TYPE_COUNT). */
rm_status rm_type_describe_any(int32_t type, rm_type_info * out);

/* Bytes taken by n elements of a type; 0 when n is not a whole number of blocks or the type is unknown. */
uint64_t  rm_row_bytes(int32_t type, int64_t n);

/* Quantize n_rows rows of n_per_row floats (n_per_row a multiple of the block size) into dst,
 * which holds dst_cap bytes. Rows are split across n_threads threads (<= 0: all cores). */
rm_status rm_quantize(int32_t type, const float * src, int64_t n_rows, int64_t n_per_row,
                      void * dst, uint64_t dst_cap, int32_t n_threads);

/* rm_quantize with the importance of each input column: importance (n_per_row entries, finite,
 * >= 0, or NULL) weighs the squared error of every row's element in that column, as the mean of
 * x^2 of the activations that meet it (an importance matrix row). Only the types whose quantizer
 * searches under weights take one (IQ2_XXS, IQ3_XXS); the others answer RM_E_INVALID_ARG. */
rm_status rm_quantize_weighted(int32_t type, const float * src, int64_t n_rows, int64_t n_per_row,
                               const float * importance, void * dst, uint64_t dst_cap, int32_t n_threads);

/* Dequantize n elements (a whole number of blocks) of src (src_len bytes) into dst. */
rm_status rm_dequantize(int32_t type, const void * src, uint64_t src_len, float * dst, int64_t n);

/* Dot product of one row of n weights of `type` with n float activations, the way the runtime
 * computes it: x is first quantized to the type's vec_dot_type, then the kernel runs. */
rm_status rm_vec_dot(int32_t type, const void * w, uint64_t w_len, const float * x, int64_t n,
                     float * out);

/* ---------------------------------------------------------------------------------------------
 * CPU kernel sets ("isa"): "scalar" (the reference, always there), "avx2", "avx512", "amx"
 * ("amx": AVX-512 plus AMX tiles for prefill; granted by the OS at first use)
 * ------------------------------------------------------------------------------------------- */

/* The set the CPU backend uses. Chosen at first use: the best this CPU and build support (a lower
 * one on CPU families where that was measured faster: none so far), or the one the environment
 * variable RAPIDMOE_ISA=scalar|avx2|avx512|amx names; a set that is not available falls back,
 * with a warning on stderr. */
const char * rm_cpu_isa(void);

/* Why rm_cpu_isa is the set it is, in words (for `rapidmoe bench` and logs). */
const char * rm_cpu_isa_reason(void);

/* 1 when this CPU and build can run the set named isa, else 0. */
int32_t   rm_cpu_isa_supported(const char * isa);

/* For tests and benchmarks: y[t * n_rows + r] = the dot product of row r of w (n_rows rows of n
 * weights of `type`, w_len bytes) with token t of x_q (n_tok rows of n activations already in the
 * type's vec_dot_type, x_len bytes), by the kernels of set isa (NULL: the set in use). batched = 1
 * computes as the CPU backend computes a matrix product (several tokens per kernel call where the
 * type has a kernel for it: from 8 tokens the prefill form that packs each row once, from 16 the
 * AMX tiles); batched = 0 calls the one-token kernel for each row and token; batched = 2 computes
 * as batched = 1 from the rows repacked first into the set's stored layout, as a CPU-only model
 * keeps them from load (where the set has one for the type and row length; else as batched = 1);
 * batched = 3 as 2 from rows given in the stored layout already (rm_repack_rows_isa's).
 * RM_E_UNSUPPORTED_TYPE when this CPU or build lacks the set. */
rm_status rm_vec_dot_isa(const char * isa, int32_t type, const void * w, uint64_t w_len, int64_t n_rows,
                         const void * x_q, uint64_t x_len, int64_t n_tok, int64_t n, int32_t batched, float * y);

/* For tests and benchmarks: the n_rows rows of w (n weights of `type` each, w_len bytes) converted
 * into set isa's stored layout, as a CPU-only model keeps them from load, into out (as many bytes).
 * RM_E_INVALID_ARG where the set keeps no such rows (the type, or the row length). */
rm_status rm_repack_rows_isa(const char * isa, int32_t type, const void * w, uint64_t w_len, int64_t n_rows, int64_t n,
                             void * out);

/* The activation quantizer the CPU backend uses with set isa (NULL: the set in use): n floats of
 * x to dst (dst_cap bytes). It writes the same bytes as rm_quantize. */
rm_status rm_quantize_isa(const char * isa, int32_t type, const float * x, int64_t n, void * dst,
                          uint64_t dst_cap);

/* ---------------------------------------------------------------------------------------------
 * GGUF v3 reader (mmap; validates every count, length, offset, type and dimension)
 * ------------------------------------------------------------------------------------------- */

typedef struct rm_gguf rm_gguf;

typedef enum rm_gguf_type {
    RM_GGUF_UINT8   = 0,
    RM_GGUF_INT8    = 1,
    RM_GGUF_UINT16  = 2,
    RM_GGUF_INT16   = 3,
    RM_GGUF_UINT32  = 4,
    RM_GGUF_INT32   = 5,
    RM_GGUF_FLOAT32 = 6,
    RM_GGUF_BOOL    = 7,
    RM_GGUF_STRING  = 8,
    RM_GGUF_ARRAY   = 9,
    RM_GGUF_UINT64  = 10,
    RM_GGUF_INT64   = 11,
    RM_GGUF_FLOAT64 = 12
} rm_gguf_type;

typedef struct rm_tensor_info {
    rm_str       name;
    int32_t      type;            /* ggml type id */
    int32_t      n_dims;
    int64_t      ne[4];           /* unused dims are 1 */
    uint64_t     offset;          /* relative to the data section */
    uint64_t     nbytes;
    const void * data;            /* into the mapping */
} rm_tensor_info;

rm_status   rm_gguf_open(const char * path, rm_gguf ** out);
void        rm_gguf_close(rm_gguf * g);

uint32_t    rm_gguf_version(const rm_gguf * g);
uint32_t    rm_gguf_alignment(const rm_gguf * g);
uint64_t    rm_gguf_data_offset(const rm_gguf * g);
/* The tensor-info block, [begin, end) in the file: what a RESplit sidecar's base identity hashes. */
uint64_t    rm_gguf_infos_begin(const rm_gguf * g);
uint64_t    rm_gguf_infos_end(const rm_gguf * g);
uint64_t    rm_gguf_file_size(const rm_gguf * g);

int64_t     rm_gguf_n_kv(const rm_gguf * g);
int64_t     rm_gguf_find_kv(const rm_gguf * g, const char * key);      /* -1 when absent */
rm_str      rm_gguf_kv_key(const rm_gguf * g, int64_t i);
int32_t     rm_gguf_kv_type(const rm_gguf * g, int64_t i);             /* rm_gguf_type, -1 if i is out of range */
int32_t     rm_gguf_kv_arr_type(const rm_gguf * g, int64_t i);         /* element type of an ARRAY, else -1 */
uint64_t    rm_gguf_kv_arr_n(const rm_gguf * g, int64_t i);            /* element count of an ARRAY, else 0 */
/* Scalars: the value's bytes; arrays of numbers/bools: the first element; otherwise NULL. */
const void * rm_gguf_kv_data(const rm_gguf * g, int64_t i);
rm_str      rm_gguf_kv_str(const rm_gguf * g, int64_t i);              /* a STRING value */
rm_str      rm_gguf_kv_arr_str(const rm_gguf * g, int64_t i, uint64_t j); /* element j of a string ARRAY */

int64_t     rm_gguf_n_tensors(const rm_gguf * g);
int64_t     rm_gguf_find_tensor(const rm_gguf * g, const char * name); /* -1 when absent */
rm_status   rm_gguf_tensor_info(const rm_gguf * g, int64_t i, rm_tensor_info * out);

/* ---------------------------------------------------------------------------------------------
 * Architectures, as data (native/src/model/arch.c)
 *
 * One row per general.architecture this build runs: the keys the loader reads (with defaults
 * and ranges), the tensors each layer holds (names, shapes, which file, required or not) and the
 * few behaviours the file does not state. The loader binds a model by walking the row; the
 * converter and the planner read the same row through these calls.
 * ------------------------------------------------------------------------------------------- */

typedef enum rm_qk_norm {
    RM_QK_NORM_NONE     = 0,
    RM_QK_NORM_PER_HEAD = 1,      /* RMSNorm over each head, weight ne = {head_dim} (Qwen3) */
    RM_QK_NORM_FULL     = 2       /* RMSNorm over all of q (resp. k), weight ne = {n_head*head_dim} (OLMoE) */
} rm_qk_norm;

typedef enum rm_rope_kind {
    RM_ROPE_NORM = 0,             /* rotate pairs (x[2i], x[2i+1]): llama.cpp's llama arch, q/k rows permuted at conversion */
    RM_ROPE_NEOX = 1              /* rotate pairs (x[i], x[i + n_rot/2]) */
} rm_rope_kind;

typedef enum rm_shared_expert {
    RM_SHEXP_NONE  = 0,
    RM_SHEXP_GATED = 1,           /* out += sigmoid(gate_inp_shexp . x) * ffn_shexp(x) (Qwen2-MoE) */
    RM_SHEXP_PLAIN = 2            /* out += ffn_shexp(x), no gate (DeepSeek, GLM) */
} rm_shared_expert;

/* How the router's logits become scores (llama.cpp's expert_gating_func values). */
typedef enum rm_gating {
    RM_GATING_SOFTMAX = 1,        /* softmax over the experts (Mixtral, Qwen, OLMoE, DeepSeek-V2) */
    RM_GATING_SIGMOID = 2,        /* a sigmoid per expert (DeepSeek-V3, GLM-4.5) */
    RM_GATING_SQRT_SOFTPLUS = 4   /* sqrt(softplus) per expert (DeepSeek-V4; llama.cpp's 4): not run yet */
} rm_gating;

/* What one layer is: one attention kind, one FFN kind, and features. A row gives every layer
 * the same kind unless a kind rule (read from a key, e.g. leading dense layers) changes some;
 * the loader refuses a layer with bits outside RM_LAYER_RUNS, naming the layer and the kind. */
enum {
    RM_LAYER_ATTN_FULL    = 0x0001,   /* causal attention over the whole context */
    RM_LAYER_ATTN_SLIDING = 0x0002,   /* attention over a sliding window (gpt-oss) */
    RM_LAYER_ATTN_LINEAR  = 0x0004,   /* linear attention, e.g. a gated delta rule (Qwen3.5 hybrids) */
    RM_LAYER_ATTN_MLA     = 0x0008,   /* multi-head latent attention (DeepSeek, GLM) */
    RM_LAYER_FFN_MOE      = 0x0010,   /* routed experts */
    RM_LAYER_FFN_DENSE    = 0x0020,   /* one dense FFN */
    RM_LAYER_SHEXP        = 0x0040,   /* a shared expert beside the routed ones */
    RM_LAYER_QK_NORM_HEAD = 0x0080,   /* q/k RMSNorm per head */
    RM_LAYER_QK_NORM_FULL = 0x0100,   /* q/k RMSNorm over the whole projection */
    RM_LAYER_BIAS         = 0x0200,   /* the q/k/v projections must carry biases (else they may) */
    RM_LAYER_SINKS        = 0x0400,   /* attention sinks: a learned logit per head */
    RM_LAYER_EXP_BIAS     = 0x0800,   /* biases on the router and on every expert's three products (gpt-oss) */
    RM_LAYER_SWIGLU_CLAMP = 0x1000,   /* the experts' SwiGLU clamped, with (up + 1) (gpt-oss) */
    RM_LAYER_MLA_Q_LORA   = 0x2000,   /* MLA's query through a low-rank q_a/q_b pair (DeepSeek-V2/V3) */
    RM_LAYER_MLA_Q_DIRECT = 0x4000,   /* MLA's query from one projection (DeepSeek-V2-Lite) */
    RM_LAYER_ATTN_GATE    = 0x10000,  /* full attention whose q projection also gives a sigmoid output gate (Qwen3-Next) */
    RM_LAYER_SSM_BA       = 0x20000,  /* linear attention: beta and alpha in one fused projection, grouped per key head (qwen3next) */
    RM_LAYER_SSM_V_TILED  = 0x40000,  /* linear attention: value head h reads key head h % n_k, not h / (n_v/n_k) (qwen35moe) */
    RM_LAYER_GELU         = 0x80000,  /* the FFNs' gate through GELU (tanh form) instead of SiLU (Gemma 4) */
    RM_LAYER_POST_NORM    = 0x100000, /* the attention and FFN outputs RMS-normed before their residual adds; with
                                         FFN_MOE and FFN_DENSE both set, a dense FFN beside the experts, each
                                         with its own norms (Gemma 4) */
    RM_LAYER_V_NORM       = 0x200000, /* values RMS-normed without a weight; a layer without attn_v takes its
                                         values from the key projection (Gemma 4) */
    RM_LAYER_HEAD_GATE    = 0x400000, /* the attention output times a sigmoid gate per head, projected from the
                                         layer's input (attn_gate: Step-3.5) */
    RM_LAYER_DSA_INDEX    = 0x800000, /* MLA over the positions a lightning indexer of the layer's own picks, its
                                         top_k best by the indexer's scores (DeepSeek sparse attention: GLM-5) */
    RM_LAYER_DSA_SHARED   = 0x1000000,/* MLA over the positions the previous indexed layer picked (GLM-5.2) */
    RM_LAYER_QSA_INDEX    = 0x2000000,/* gated attention over the key blocks a QSA indexer picks (qwen4exp) */
    RM_LAYER_PLE          = 0x4000000,/* hashed n-gram embeddings gated into the residual streams before the
                                         token mixer (qwen4exp's PLE, on the layers ple.layers lists) */
    /* DeepSeek-V4 (CPU only) */
    RM_LAYER_CSA          = 0x8000000,/* attention also over compressed entries of 4 positions (overlapping
                                         windows) that an indexer picks (compress ratio 4) */
    RM_LAYER_HCA          = 0x10000000,/* attention also over every compressed entry of 128 positions (ratio 128) */
    RM_LAYER_HASH_ROUTE   = 0x20000000,/* the experts picked by a table per token id (the first hash_layer_count) */
    RM_LAYER_MHC          = 0x40000000,/* manifold-constrained hyper-connections: hc_count residual streams mixed by
                                         a Sinkhorn-projected matrix around every block; attention whose one key
                                         head is its value, with sinks and a grouped output projection */
    RM_LAYER_RUNS         = 0x7FFF7FFF /* the bits the forward pass runs today */
};

typedef enum rm_hparam_kind {
    RM_HPARAM_INT   = 0,
    RM_HPARAM_BOOL  = 1,          /* read as an integer 0/1; a bool or an integer key */
    RM_HPARAM_FLOAT = 2           /* must be finite and > 0 */
} rm_hparam_kind;

typedef struct rm_arch_info {
    const char * name;            /* general.architecture */
    const char * family;          /* the models it runs when the name does not say: "Mixtral"; else "" */
    int32_t      qk_norm;         /* rm_qk_norm */
    int32_t      rope;            /* rm_rope_kind */
    int32_t      shared_expert;   /* rm_shared_expert */
    uint32_t     layer_kind;      /* RM_LAYER_* bits of a layer no kind rule changes */
    int32_t      n_hparams;
    int32_t      n_tensors;       /* per-layer tensor templates some layer holds: of layer_kind, or of a
                                   * kind the kind rules give (a leading dense layer's FFN) */
    int32_t      n_kind_rules;
} rm_arch_info;

/* A value of an hparam row is written as text: a number, a field ("n_head") or a quotient of two
 * fields ("n_embd/n_head", integer division) of the rows read before it; "" when not given. */
typedef struct rm_arch_hparam_info {
    const char * key;             /* after "{arch}.": "attention.head_count_kv" */
    const char * field;           /* the value it fills: "n_head_kv" (rm_model_info's names where it has one) */
    int32_t      kind;            /* rm_hparam_kind */
    int32_t      required;        /* no default: a file without the key is refused */
    char         dflt[32];        /* the value when the key is absent */
    char         min[32];         /* the accepted range (else RM_E_FORMAT); "": unbounded */
    char         max[32];
    char         run_min[32];     /* the range the forward pass runs (else RM_E_UNSUPPORTED_ARCH); "": all */
    char         run_max[32];
    const char * field_swa;       /* the key may also hold one value per layer: the sliding layers' value
                                     fills this field (Gemma 4's head_count_kv); NULL: one value */
} rm_arch_hparam_info;

typedef struct rm_arch_tensor_info {
    const char * name;            /* a printf pattern over the layer: "blk.%d.attn_q.weight" */
    const char * field;           /* the layer field it fills: "wq" */
    int32_t      residual;        /* 1: in the residual sidecar (bound only with one), 0: the base file */
    int32_t      required;        /* for a layer of the first kind that holds it (layer_kind when it does) */
    int32_t      f32;             /* the forward pass reads it as floats: it must be F32 */
    int32_t      expert;          /* ne[2] holds one matrix per routed expert */
    uint32_t     when;            /* the RM_LAYER_* bits a layer needs to hold it */
    const char * ne[3];           /* "n_embd", "n_q" (n_head*head_dim), "n_kv" (n_head_kv*head_dim),
                                     "head_dim", "n_ff_exp", "n_ff_shexp", "n_expert", "n_head", "any" or "1" */
} rm_arch_tensor_info;

int32_t   rm_arch_count(void);
/* arch in [0, rm_arch_count()); RM_E_INVALID_ARG outside. */
rm_status rm_arch_describe(int32_t arch, rm_arch_info * out);
/* i in [0, n_hparams), in the order the loader reads them. */
rm_status rm_arch_hparam_describe(int32_t arch, int32_t i, rm_arch_hparam_info * out);
/* i in [0, n_tensors), in the order the loader binds them. */
rm_status rm_arch_tensor_describe(int32_t arch, int32_t i, rm_arch_tensor_info * out);


/* ---------------------------------------------------------------------------------------------
 * Models and sessions
 *
 * A model owns the mapped weights (the base file and, optionally, the residual sidecar) and a
 * pool of worker threads. A session borrows its model (free every session before the model) and
 * owns a KV cache of n_ctx positions. Calls on one model are serialised by the model.
 * ------------------------------------------------------------------------------------------- */

typedef struct rm_model   rm_model;
typedef struct rm_session rm_session;

/* Where a model runs (rm_model_params.use_gpu). RM_GPU_STANDIN is a second CPU backend posing as
 * the device (own buffers and memory budget, counted copies, the same placement and split as
 * CUDA): it tests the CPU/GPU split on machines without a GPU; it is never faster. */
enum { RM_GPU_NONE = 0, RM_GPU_CUDA = 1, RM_GPU_STANDIN = 2 };

/* How rm_model_load brings a model's files into memory (rm_model_params.load). */
enum { RM_LOAD_AUTO = 0, RM_LOAD_MMAP = 1, RM_LOAD_READ = 2, RM_LOAD_STREAM = 3 };
enum { RM_PREFETCH_NONE = 0, RM_PREFETCH_KNOWN = 1, RM_PREFETCH_PREDICT = 2 };   /* rm_model_params.prefetch */

/* struct_size may also be offsetof(rm_model_params, use_gpu), the size before the GPU fields
 * (ABI 1 callers): those fields then take their zero defaults, which mean "CPU only". */
typedef struct rm_model_params {
    uint32_t     struct_size;     /* sizeof(rm_model_params) */
    int32_t      n_threads;       /* <= 0: all online CPUs */
    const char * residual_path;   /* the RESplit sidecar, or NULL for base only */
    /* --- GPU placement (the CUDA backend). When no GPU can be used (none present, or a build
     * without CUDA) the model loads on the CPU and rm_model_gpu_info says why. --- */
    int32_t      use_gpu;         /* RM_GPU_NONE, RM_GPU_CUDA (device gpu_device) or RM_GPU_STANDIN */
    int32_t      gpu_device;      /* CUDA device ordinal */
    uint64_t     gpu_memory_bytes;/* hard cap on device memory (weights, KV caches, scratch); 0: none */
    /* n_layer * n_expert bytes, layer-major: 1 = the expert's base lives on the GPU, 0 = in host
     * memory (computed by the CPU at base precision); NULL: every expert on the GPU. Residuals
     * always stay in host memory. */
    const uint8_t * expert_on_gpu;
    /* Prefill: an expert whose residual is needed by at least this many tokens of a batch has
     * its residual copied to the GPU for that batch instead of computed by the CPU (the
     * crossover of rapidmoe plan); 0: never. */
    int32_t      residual_upload_min_tokens;
    int32_t      reserved;        /* 0; keeps `load` past the end of ABI 6's struct (its size was 48) */
    /* RM_LOAD_MMAP maps the files: pages are read on first use and the kernel may drop them again
     * under memory pressure, so a model larger than the memory still runs. RM_LOAD_READ reads
     * them whole into anonymous memory, in 2 MiB pages where the kernel has transparent huge
     * pages: a decode streams every weight it uses once per token, and with the 4 KiB pages of a
     * mapped file each page costs a TLB miss. RM_LOAD_AUTO (0) reads a file when huge pages can
     * be had and it fits in three quarters of the available memory (MemAvailable, or the room under
     * the process's memory cgroup limit where that is less: a container's), and maps it otherwise (and
     * always maps for a GPU placement, whose experts live on the device).
     * RM_LOAD_STREAM is for models larger than the memory (CPU only): the weights other than the
     * routed experts stay in memory, and each expert's matrices are read from the files when a
     * token is routed to it, into a cache that fills ram_budget_bytes (least often used out
     * first, bases kept before residuals), one read at a time.
     * RM_LOAD_AUTO streams a CPU model whose files take more than the memory the process may take,
     * with the default budget below. */
    int32_t      load;
    /* RM_LOAD_STREAM's reads ahead of use, by a reader thread while the CPU computes: 0 none (each
     * expert read when the evaluation reaches it); 1 (RM_PREFETCH_KNOWN) a batch's experts beyond
     * what the cache holds at once, read while it computes the ones before; 2 (RM_PREFETCH_PREDICT)
     * also the next layer's experts as its router predicts them from the current hidden state. */
    int32_t      prefetch;
    /* RM_LOAD_STREAM: the bytes the weights may take in memory (the resident ones and the expert
     * cache together); 0: three quarters of what the process may take (MemAvailable, or the room
     * under its memory cgroup's limit). */
    uint64_t     ram_budget_bytes;
} rm_model_params;

typedef struct rm_model_info {
    char    arch[32];
    int32_t n_vocab;
    int32_t n_embd;
    int32_t n_layer;
    int32_t n_head;
    int32_t n_head_kv;
    int32_t head_dim;
    int32_t n_expert;
    int32_t n_expert_used;
    int32_t n_ff_exp;
    int32_t n_ff_shexp;           /* 0 without a shared expert */
    int32_t n_ctx_train;
    int32_t norm_topk;
    int32_t has_residual;
    int32_t n_threads;
    uint64_t base_expert_bytes;     /* bytes of all expert base tensors */
    uint64_t residual_expert_bytes; /* bytes of all expert residual tensors */
    uint64_t dense_bytes;           /* everything but experts read per token (attention, router, shared, norms, output) */
    int32_t n_ff;                   /* the dense FFN's width (leading dense layers); 0 without */
    int32_t n_layer_dense_lead;     /* leading layers with a dense FFN instead of experts */
    int32_t n_rot;                  /* rotary dimensions per head */
    int32_t head_dim_v;             /* value head width (MLA: v_head_dim) */
    int32_t q_lora_rank;            /* MLA: the query's low rank; 0: a direct projection */
    int32_t kv_lora_rank;           /* MLA: the latent's width; 0 without MLA */
    /* linear-attention layers as rm_size_params takes them (their recurrent state); 0 without */
    int32_t n_layer_linear;
    int32_t ssm_d_conv, ssm_conv_dim;
    int32_t ssm_n_v, ssm_d_state, ssm_head_v;
    int32_t n_swa;                  /* sliding-window layers (gpt-oss): their window; 0 without */
    int32_t n_layer_swa;            /* how many layers slide (each caches a ring, rm_size_params) */
    int32_t n_head_kv_swa;          /* the sliding layers' kv heads and head width where they differ from
                                     * the others' (Gemma 4); else n_head_kv and head_dim */
    int32_t head_dim_swa;
    int32_t n_head_swa;             /* the sliding layers' query heads (Step-3.5); else n_head */
    int32_t index_head_dim;         /* DeepSeek sparse attention: the indexer's key width (cached beside each
                                     * latent); 0 without */
    int32_t index_n_head, index_top_k;  /* its query heads, and the positions each token attends to */
    int32_t hc_count, hc_low_rank;  /* hyper-connections (qwen4exp): residual streams and their gates' rank; 0 without */
    int32_t n_layer_ple;            /* PLE layers (qwen4exp) and their sizes as rm_size_params takes them; 0 without */
    int32_t ple_ngram, ple_conv_kernel, ple_embd;
    int32_t n_layer_csa, n_layer_hca; /* DeepSeek-V4's compressed layers (ratio 4 with an indexer, ratio 128) */
} rm_model_info;

rm_status rm_model_load(const char * path, const rm_model_params * params, rm_model ** out);

/* The expert cache of a streamed model (RM_LOAD_STREAM), counted since the load; all zero but
 * struct_size for a model whose weights are all in memory. A unit is one expert's base matrices
 * or its residual's. */
typedef struct rm_expert_cache_stats {
    uint32_t struct_size;         /* sizeof(rm_expert_cache_stats) */
    int32_t  streaming;           /* 1: the experts are read from the files on demand */
    int32_t  slots;               /* units the cache holds */
    int32_t  slots_used;
    int32_t  direct_io;           /* 1: read with O_DIRECT, past the page cache */
    int32_t  reserved;
    uint64_t budget_bytes;        /* the weights' budget (ram_budget_bytes, or the default) */
    uint64_t resident_bytes;      /* the weights kept in memory: all but the routed experts */
    uint64_t cache_bytes;         /* the slots' memory */
    uint64_t slot_bytes;
    uint64_t hits;                /* units found in the cache */
    uint64_t misses;              /* units the evaluation read itself */
    uint64_t prefetched;          /* units the reader thread read ahead of use */
    uint64_t prefetch_used;       /* of those, units the evaluation then asked for */
    uint64_t evictions;
    uint64_t bytes_read;          /* from the files, by both */
    uint64_t wait_us;             /* time the evaluation waited on reads */
    uint64_t read_errors;
} rm_expert_cache_stats;
rm_status rm_model_expert_cache_stats(const rm_model * model, rm_expert_cache_stats * out);
void      rm_model_free(rm_model * model);
rm_status rm_model_info_get(const rm_model * model, rm_model_info * out);

/* A GGUF file's architecture and hyperparameters read as rm_model_load reads them (the same rows,
 * defaults, ranges and errors), without binding tensors: arch and the hyperparameter fields of
 * out are set, the others are 0 (n_vocab comes from a tensor). path is only named in messages. */
rm_status rm_arch_read_hparams(const rm_gguf * g, const char * path, rm_model_info * out);

/* Where the model runs. With use_gpu set and no usable GPU, active is 0 and note says why
 * ("built without CUDA", "no CUDA device: ..."); the model then runs on the CPU. */
typedef struct rm_gpu_info {
    uint32_t struct_size;         /* sizeof(rm_gpu_info) */
    int32_t  requested;           /* the params asked for a GPU */
    int32_t  active;              /* sessions run on the CUDA backend */
    int32_t  device;
    char     device_name[128];
    uint64_t budget_bytes;        /* gpu_memory_bytes (0: no cap) */
    uint64_t weight_bytes;        /* weights copied to the device at load */
    uint64_t used_bytes;          /* device memory held now: weights, and every live session's */
    int32_t  n_experts_on_gpu;    /* expert bases on the device, of n_layer * n_expert */
    int32_t  n_experts_total;
    char     note[256];           /* why the CPU runs although a GPU was asked for; else "" */
} rm_gpu_info;

rm_status rm_model_gpu_info(const rm_model * model, rm_gpu_info * out);

typedef struct rm_session_params {
    uint32_t struct_size;         /* sizeof(rm_session_params) */
    int32_t  n_ctx;               /* KV cache positions; <= 0: the model's training context */
    int32_t  n_batch;             /* tokens per prefill step; <= 0: 512 */
    int32_t  type_k, type_v;      /* the KV cache's element types (rm_type): RM_TYPE_F32 (0), F16, BF16,
                                   * Q8_0, Q4_0, Q4_1, Q5_0 or Q5_1 (llama.cpp's cache types but IQ4_NL), else
                                   * RM_E_UNSUPPORTED_TYPE; a block type needs head_dim a multiple of its
                                   * block. Types other than F32: not with MLA (RM_E_UNSUPPORTED_TYPE),
                                   * and on the CPU backend only (RM_E_NEEDS_CPU) */
} rm_session_params;

rm_status rm_session_new(rm_model * model, const rm_session_params * params, rm_session ** out);
void      rm_session_free(rm_session * s);
rm_status rm_session_reset(rm_session * s);
int32_t   rm_session_n_past(const rm_session * s);
int32_t   rm_session_n_ctx(const rm_session * s);

/* Feed n tokens after the n_past already in the cache (prefill when many, decode when one).
 * logits receives the last position's logits (n_vocab floats) or, with all_logits, every
 * position's (n * n_vocab floats); logits may be NULL with logits_cap 0 to skip the output head
 * (all_logits == 0). RM_E_CONTEXT_FULL when the tokens do not fit in the context; the cache is
 * then unchanged. */
rm_status rm_session_eval(rm_session * s, const int32_t * tokens, int32_t n, int32_t all_logits,
                          float * logits, uint64_t logits_cap);

/* Keeps the first n_keep positions of the cache and drops the rest, so that the next tokens
 * follow them (a prompt that shares a prefix with what the cache holds evaluates only the rest).
 * RM_E_INVALID_ARG outside [0, n_past]; RM_E_STATE where the cache cannot go back there: a
 * hybrid model's recurrent state describes all n_past positions, so it goes back only to 0,
 * n_past or a position rm_session_checkpoint kept; a sliding-window layer's ring keeps n_batch
 * positions beyond its window. The results after a truncation are bit for bit those of the
 * kept tokens evaluated anew. */
rm_status rm_session_truncate(rm_session * s, int32_t n_keep);

/* The most positions <= n_keep that rm_session_truncate can keep (0: none). */
int32_t   rm_session_reusable(const rm_session * s, int32_t n_keep);

/* A hybrid model: keeps a copy of the recurrent states at n_past, so that the cache can later be
 * truncated back to it (the last RM_HYBRID_CHECKPOINTS = 2 such positions per session; the
 * copies take rm_session_sizes' recurrent_state's share of the conv and delta-rule states each).
 * Other models: nothing to keep, RM_OK. Take one where a later prompt may diverge: at the end of
 * a prompt (the next turn of a chat repeats it). */
rm_status rm_session_checkpoint(rm_session * s);

/* A session's state as bytes: its cache's positions 0 .. n_past - 1 (the KV cache's rows as the
 * cache holds them, a hybrid model's conv and delta-rule states, the residual policy's controllers;
 * not the hybrid's checkpoints), for
 * rm_session_state_load into a session of the same model with the same cache types. The bytes
 * carry no identity of the model: a caller that keeps them in a file checks that itself.
 * rm_session_state_size gives the bytes rm_session_state_save writes (RM_E_INVALID_ARG with a
 * smaller cap). rm_session_state_load checks the layout (layers, cache types and row sizes,
 * recurrent-state sizes), that the positions fit the session's context, and that a sliding-window
 * layer's ring places them alike (else RM_E_STATE or RM_E_FORMAT, naming what differs; the session
 * is then unchanged); after it, the session continues as the saved one did. */
rm_status rm_session_state_size(const rm_session * s, uint64_t * bytes);
rm_status rm_session_state_save(const rm_session * s, void * buf, uint64_t cap);
rm_status rm_session_state_load(rm_session * s, const void * buf, uint64_t size);

/* Several sequences in one evaluation: token i belongs to sessions[seq[i]] (sessions of one model,
 * each at most once) at position pos[i], which must follow that session's cache and its previous
 * token in the batch (pos NULL: so implied). The tokens of all sequences go through each layer
 * together: one product per weight matrix, and in the MoE block one per routed expert for all the
 * tokens routed to it; attention runs per sequence over its session's cache, and each token's
 * residual choices follow its session's policy. Token i's logits go to out when logits[i] is
 * nonzero, one row of n_vocab floats per such token, in batch order (logits NULL: none). More
 * tokens than sessions[0]'s n_batch run in several steps. Every architecture: multi-head latent
 * attention runs per sequence over its session's latent cache, a linear (recurrent) layer's
 * convolution and delta rule per sequence on its session's states. The CPU backend only
 * (RM_E_NEEDS_CPU); a calibrating session is refused (RM_E_STATE). A refused batch changes no
 * session; a backend that fails during the evaluation leaves every session's n_past as before,
 * but (as rm_session_eval) not a hybrid's recurrent states, which then need rm_session_reset. */
typedef struct rm_batch {
    uint32_t              struct_size;   /* sizeof(rm_batch) */
    int32_t               n_tokens;
    const int32_t *       tokens;        /* n_tokens */
    const int32_t *       seq;           /* n_tokens: indices into sessions */
    const int32_t *       pos;           /* n_tokens, or NULL */
    const int8_t *        logits;        /* n_tokens, or NULL */
    rm_session * const *  sessions;      /* n_sessions */
    int32_t               n_sessions;
    float *               out;           /* n_vocab floats per token with logits[i] != 0 */
    uint64_t              out_cap;       /* floats */
} rm_batch;

rm_status rm_batch_eval(const rm_batch * batch);

/* ---------------------------------------------------------------------------------------------
 * Memory sizes
 *
 * What a session will allocate, from the hyperparameters alone, so that a planner can place a
 * model on a device before loading it. The library allocates with the same functions
 * (native/src/model/sizes.c), so the numbers it gives and the memory it takes cannot drift apart.
 * ------------------------------------------------------------------------------------------- */

/* Each range of weights a device holds starts on this boundary and takes a multiple of it. */
#define RM_DEVICE_ALIGN 256

typedef struct rm_size_params {
    uint32_t struct_size;         /* sizeof(rm_size_params) */
    int32_t  n_layer, n_embd, n_head, n_head_kv, head_dim;
    int32_t  n_expert, n_expert_used, n_ff_exp, n_ff_shexp, n_vocab;
    int32_t  n_ctx;               /* KV cache positions (> 0) */
    int32_t  n_batch;             /* as given to rm_session_new (<= 0: 512; clamped to n_ctx) */
    uint64_t stage_expert_bytes;  /* one expert's three residual matrices, the largest layer's;
                                   * 0: the device stages no residuals in prefill */
    int32_t  n_ff;                /* dense FFN width; 0 without dense layers */
    int32_t  kv_lora_rank;        /* MLA: the cache holds kv_lora_rank + n_rot floats per position and
                                   * layer instead of K and V; 0 without MLA */
    int32_t  n_rot;               /* MLA: the rotary part of a query/key head */
    int32_t  head_dim_v;          /* MLA: the value head width; 0: head_dim */
    int32_t  n_layer_linear;      /* layers with linear attention (a recurrent state each); 0: none */
    int32_t  ssm_d_conv, ssm_conv_dim;   /* their conv kernel length and channels */
    int32_t  ssm_n_v, ssm_d_state, ssm_head_v; /* value heads, key and value head widths */
    int32_t  n_swa;               /* sliding-window layers (gpt-oss): their window; 0 without */
    int32_t  n_layer_swa;         /* how many layers slide: each keeps a ring of n_swa + n_batch
                                   * positions (at most n_ctx) instead of n_ctx */
    int32_t  type_k, type_v;      /* the KV cache's element types (rm_session_params'; 0: F32) */
    int32_t  n_head_kv_swa;       /* the sliding layers' kv heads and head width (Gemma 4); 0: n_head_kv */
    int32_t  head_dim_swa;        /* and head_dim */
    int32_t  n_head_swa;          /* the sliding layers' query heads (Step-3.5); 0: n_head */
    int32_t  index_head_dim;      /* DeepSeek sparse attention: each latent row also holds the indexer's
                                   * key of this width; QSA (qwen4exp, kv_lora_rank 0): each attention layer
                                   * caches the indexer's key (F32) per position; 0 without */
    int32_t  index_n_head;        /* and the indexer's query heads */
    int32_t  hc_count;            /* hyper-connections (qwen4exp): the residual streams; 0 without */
    int32_t  hc_low_rank;         /* and their gates' rank */
    int32_t  n_layer_ple;         /* PLE layers (qwen4exp): each keeps (ple_conv_kernel - 1) * ple_ngram positions
                                   * of hc_count * n_embd floats for its dilated conv, and the session the last
                                   * ple_ngram - 1 tokens; 0 without */
    int32_t  ple_ngram, ple_conv_kernel;
    int32_t  ple_embd;            /* the n-gram embedding's width (all its heads) */
    int32_t  n_layer_csa;         /* DeepSeek-V4: layers compressing by 4 (two series of head_dim, and an indexer
                                   * of index_head_dim), each with an entry per 4 positions and the rows of its
                                   * last two windows; 0 without */
    int32_t  n_layer_hca;         /* and by 128 (one series of head_dim), an entry per 128 positions and the rows
                                   * of its last window */
} rm_size_params;

typedef struct rm_session_sizes {
    uint32_t struct_size;         /* sizeof(rm_session_sizes) */
    uint64_t kv_cache;            /* K and V of every layer for n_ctx positions (a sliding layer: its ring) */
    uint64_t activations;         /* the forward pass's buffers for a step of n_batch tokens */
    uint64_t split_routing;       /* a device session only: each slot's route, token row and weight */
    uint64_t split_scratch;       /* a device session only: the CPU/GPU split's buffers and tables */
    uint64_t split_stage;         /* a device session only: prefill residual copies (0 without) */
    uint64_t recurrent_state;     /* linear-attention layers: conv (with PLE's, qwen4exp) and delta-rule states, their scratch and
                                   * checkpoint copies (rm_session_checkpoint) (host) */
} rm_session_sizes;

/* The bytes one session allocates on its backend: on a device (CUDA or the stand-in) all five
 * parts, on the CPU the first two. */
rm_status rm_session_sizes_get(const rm_size_params * params, rm_session_sizes * out);

/* The expert table a model on a device holds once, beside its weights: the device address of
 * every expert's gate, up and down matrix. 0 for a negative count. */
uint64_t  rm_device_expert_table_bytes(int32_t n_layer, int32_t n_expert);

/* ---------------------------------------------------------------------------------------------
 * Sampling
 * ------------------------------------------------------------------------------------------- */

typedef struct rm_sampler rm_sampler;

typedef struct rm_sampler_params {
    uint32_t struct_size;         /* sizeof(rm_sampler_params) */
    float    temperature;         /* <= 0: greedy */
    int32_t  top_k;               /* <= 0: off */
    float    top_p;               /* 1: off */
    float    min_p;               /* 0: off */
    float    repeat_penalty;      /* 1: off */
    int32_t  repeat_last_n;       /* how many recent tokens the penalty looks at */
    uint64_t seed;
} rm_sampler_params;

rm_status rm_sampler_new(const rm_sampler_params * params, rm_sampler ** out);
void      rm_sampler_free(rm_sampler * smp);
/* Picks a token from logits (n_vocab floats, left unchanged), given the recent tokens. */
rm_status rm_sampler_sample(rm_sampler * smp, const float * logits, int32_t n_vocab,
                            const int32_t * recent, int32_t n_recent, int32_t * out_token);

/* ---------------------------------------------------------------------------------------------
 * RESplit residual policy (UMIA and its ablations)
 *
 * Each activated (token, layer, expert) slot gets a score; a slot gets its expert's residual when
 * log(score) >= the layer's threshold. Each layer's threshold starts at threshold0[l] (from
 * calibration) and is kept on that layer's target rate layer_budget[l] by an integral controller:
 * after every token, threshold[l] += gain * (slots selected - target). Decisions for layer l never
 * wait for a later layer, and a batch is decided token by token, exactly as decode would. The
 * controllers' state belongs to the sequence's positions (the threshold before position p follows
 * from positions 0 .. p - 1 alone), so a sequence's decisions do not depend on the other sequences
 * of its batch, on how its prompt was cut into steps, or on what the session evaluated before;
 * truncating the cache rewinds them. RANDOM and LAYER draw per (seed, position, layer, slot).
 * ------------------------------------------------------------------------------------------- */

typedef enum rm_policy_kind {
    RM_POLICY_NONE   = 0,         /* base only */
    RM_POLICY_ALL    = 1,         /* every activated slot gets its residual */
    RM_POLICY_UMIA   = 2,         /* score = gate^a * expert_score[l][e] * layer_score[l] */
    RM_POLICY_RANDOM = 3,         /* score = a seeded uniform draw */
    RM_POLICY_GATE   = 4,         /* score = the router weight */
    RM_POLICY_EXPERT = 5,         /* score = expert_score[l][e] */
    RM_POLICY_LAYER  = 6,         /* score = log layer_score[l] + U(0,1): random within a layer */
    RM_POLICY_COUNT
} rm_policy_kind;

/* The kind's name as rapidmoe spells it ("none", "all", "umia", ...); NULL out of range. The
 * Python layer reads the kinds from here, so this enum is their one list. */
const char * rm_policy_kind_name(int32_t kind);

/* log(score) of n slots of layer l under a deterministic scored kind (UMIA, GATE or EXPERT), by
 * the formula a session selects with: experts[i] and gates[i] (the router weight) of slot i,
 * expert_score the layer's n_expert scores, layer_score the layer's. RANDOM and LAYER draw per
 * slot and are refused here (RM_E_INVALID_ARG). */
rm_status rm_policy_log_scores(int32_t kind, float gate_power, const float * expert_score, int32_t n_expert,
                               float layer_score, const int32_t * experts, const float * gates, int64_t n,
                               float * out);

typedef struct rm_residual_policy {
    uint32_t      struct_size;    /* sizeof(rm_residual_policy) */
    int32_t       kind;           /* rm_policy_kind */
    uint64_t      seed;           /* for RANDOM and tie-breaking */
    float         gate_power;     /* the exponent a on the router weight (UMIA) */
    float         gain;           /* controller gain, in log-score units per slot of error */
    const float * expert_score;   /* n_layer * n_expert, > 0; NULL: all 1 */
    const float * layer_score;    /* n_layer, > 0; NULL: all 1 */
    const float * layer_budget;   /* n_layer target fractions in [0, 1]; NULL with ALL/NONE */
    const float * threshold0;     /* n_layer initial log thresholds; NULL: all 0 */
    const uint8_t * layer_mask;   /* n_layer; 0 = never a residual in that layer; NULL: all layers */
} rm_residual_policy;

/* The policy is copied; the arrays may be freed after the call. RM_E_NO_RESIDUAL without a
 * sidecar unless kind is NONE. Restarts the controllers: the next token, and any position up to it
 * that the cache is later truncated to, starts from threshold0. */
rm_status rm_session_set_policy(rm_session * s, const rm_residual_policy * policy);

/* A given selection instead of the policy, for offline studies (the oracle of tools/umia_oracle.py):
 * slot k of the token at cache position p in layer l gets its residual iff
 * mask[(p * n_layer + l) * n_expert_used + k] != 0 (ne {n_expert_used, n_layer, n_pos}); positions
 * >= n_pos get none. The mask is copied. mask NULL (n_pos 0) or rm_session_set_policy returns to the
 * policy. RM_E_NO_RESIDUAL without a sidecar. */
rm_status rm_session_set_residual_mask(rm_session * s, const uint8_t * mask, int64_t n_pos);

/* ---------------------------------------------------------------------------------------------
 * The CPU/GPU split (docs/SPLIT.md)
 *
 * On the CUDA backend a token's MoE block runs the router and every activated expert's base on
 * the GPU while host threads compute the residual products of the slots the policy selected
 * (and the experts placed in host memory); only activations and their results cross the bus.
 * ------------------------------------------------------------------------------------------- */

typedef struct rm_backend_stats {
    uint32_t struct_size;         /* sizeof(rm_backend_stats) */
    char     backend[16];         /* "cpu", "cuda" or "standin" */
    uint64_t n_tokens;            /* tokens evaluated */
    uint64_t h2d_bytes;           /* host -> device, everything */
    uint64_t d2h_bytes;           /* device -> host */
    uint64_t h2d_weight_bytes;    /* of h2d_bytes: weights (prefill residual copies); never in decode */
    uint64_t n_syncs;             /* times the host waited for the device */
    uint64_t n_layer_steps;       /* MoE blocks that had host work (residuals or host experts) */
    uint64_t n_stalls;            /* of those, where the device finished first and waited */
    double   host_ms;             /* host time on residual products and host experts */
    double   device_ms;           /* device time on the experts' base work in those blocks */
    float    auto_budget;         /* the auto controller's budget now; -1 when it is off */
} rm_backend_stats;

/* Counters since the last rm_session_clear_stats. */
rm_status rm_session_backend_stats(const rm_session * s, rm_backend_stats * out);

/* residual_budget = "auto": an additive-increase / multiplicative-decrease rule on measured
 * times. After each decoded token, if the host's residual work of some layer outlasted that
 * layer's device work (the GPU stalled), budget *= decrease; if every layer's host work ended
 * with room to spare (host <= (1 - margin) * device), budget += increase; clamped to
 * [min_budget, max_budget]. Layers without host work count as having room. */
typedef struct rm_auto_budget {
    uint32_t struct_size;         /* sizeof(rm_auto_budget) */
    float    budget;              /* the state: share of activated slots; the start value when set */
    float    min_budget, max_budget;
    float    increase;            /* e.g. 0.005 */
    float    decrease;            /* in (0, 1), e.g. 0.7 */
    float    margin;              /* in [0, 1), e.g. 0.1 */
    float    reference_budget;    /* the budget the policy's layer_budget was built for (> 0) */
} rm_auto_budget;

/* One controller step from one token's per-layer times (microseconds; host_us[l] == 0: no host
 * work in layer l). Returns RM_E_INVALID_ARG for bad fields; updates ctl->budget. */
rm_status rm_auto_budget_step(rm_auto_budget * ctl, const float * host_us, const float * device_us,
                              int32_t n_layer);

/* Turns the controller on (ctl copied) or off (NULL). While on, each layer's target rate is the
 * policy's layer_budget[l] * budget / reference_budget (at most 1). A model streamed from its files
 * (RM_LOAD_STREAM) steps it from each layer's wait on residual reads against the rest of the
 * layer's time. Otherwise only a split session (CUDA or
 * the stand-in) measures times; on the CPU backend the budget stays where it starts.
 * RM_E_NO_BUDGET when the policy is NONE or ALL. */
rm_status rm_session_set_auto_budget(rm_session * s, const rm_auto_budget * ctl);

/* Statistics since the last rm_session_clear_stats: per (layer, expert) activations and residual
 * slots (n_layer * n_expert each, caller buffers of cap entries). */
rm_status rm_session_stats(const rm_session * s, uint64_t * active, uint64_t * residual, uint64_t cap);
rm_status rm_session_clear_stats(rm_session * s);

/* Where evaluation time goes: host wall time per part of the forward pass since the last
 * rm_session_clear_stats, split by batches of one token (decode) and of more (prefill). On the
 * CPU backend these are the parts' compute times; on a device backend, whose ops are queued, the
 * host's time in each part (waits included). */
enum {
    RM_PROF_EMBED = 0,            /* token rows looked up and dequantized */
    RM_PROF_ATTN_IN,              /* attention norm, Q/K/V products, biases, Q/K norms */
    RM_PROF_ATTN,                 /* RoPE, the KV cache write, attention */
    RM_PROF_ATTN_OUT,             /* the output projection */
    RM_PROF_ROUTER,               /* MoE norm, router product, top-k, residual choice, grouping */
    RM_PROF_EXPERTS_IN,           /* routed experts: gate and up products (base and residual) */
    RM_PROF_EXPERTS_OUT,          /* routed experts: down products (base and residual) */
    RM_PROF_EXPERTS_OTHER,        /* routed experts: gathers, SwiGLU, weighted sums; a device split's waits */
    RM_PROF_SHARED,               /* the shared expert, and the block's residual add */
    RM_PROF_OUTPUT,               /* final norm, output head, logits copied out */
    RM_PROF_COUNT
};
const char * rm_profile_part_name(int32_t part);   /* "embed", "attn_in", ...; NULL out of range */
/* us[0..RM_PROF_COUNT) decode and us[RM_PROF_COUNT..2*RM_PROF_COUNT) prefill microseconds, and
 * the tokens each saw in tokens[0] (decode) and tokens[1] (prefill). cap: entries of us (>= 2 *
 * RM_PROF_COUNT). */
rm_status rm_session_profile(const rm_session * s, double * us, int32_t cap, uint64_t * tokens);

/* Routing of the most recent token evaluated, per layer: n_layer * n_expert_used entries. */
rm_status rm_session_last_routes(const rm_session * s, int32_t * experts, float * weights,
                                 uint8_t * residual, uint64_t cap);

/* Calibration: while on (and the policy is ALL), every residual slot also runs its expert base
 * only, and |f_{B+R}(x) - f_B(x)| is summed per (layer, expert); and the routing of every position
 * in the cache is kept. Turning it on clears the sums. RM_E_NO_RESIDUAL without a sidecar,
 * RM_E_NEEDS_CPU on a device backend. */
rm_status rm_session_set_calibration(rm_session * s, int32_t on);
rm_status rm_session_calibration(const rm_session * s, double * sum_delta, uint64_t * count, uint64_t cap);
/* Importance of the experts' input columns (what an importance matrix holds): while on, every
 * row routed to an expert adds its x^2, column by column, to that expert's sums: the gate/up
 * input (n_embd columns) and the down input (n_ff_exp columns, after the activation). Turning it
 * on clears the sums; off frees them. CPU backend only (RM_E_NEEDS_CPU). rm_session_importance
 * copies them: sum_in n_layer * n_expert * n_embd, sum_ff n_layer * n_expert * n_ff_exp, count
 * n_layer * n_expert rows summed (layer-major, then expert); RM_E_STATE when not collecting. */
rm_status rm_session_set_importance(rm_session * s, int32_t on);
rm_status rm_session_importance(const rm_session * s, double * sum_in, uint64_t cap_in, double * sum_ff,
                                uint64_t cap_ff, uint64_t * count, uint64_t cap_count);
/* The routing of positions [0, n_past) recorded while calibrating: n_past * n_layer *
 * n_expert_used entries, position-major. RM_E_NOT_CALIBRATING when calibration is off. */
rm_status rm_session_route_log(const rm_session * s, int32_t * experts, float * weights, uint64_t cap);

/* RM_CDEF_END */

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif

#ifdef __cplusplus
}
#endif

#endif /* RAPIDMOE_H */
