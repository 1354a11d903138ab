/* backend.h - the operations the forward pass needs, as a table of functions.
 *
 * The model code (session.c) only calls through this table, so a second backend (CUDA) plugs in
 * beside the CPU one without touching the model code. Activations are row-major float arrays of
 * n_tok rows; weights are rm_weight views into the mapped files. */
#ifndef RM_BACKEND_H
#define RM_BACKEND_H

#include "model.h"

typedef struct rm_backend rm_backend;

typedef struct rm_matmul_args {
    const rm_weight * w;
    int64_t           mat;        /* which matrix of a 3-D tensor (expert index); 0 for 2-D */
    const float *     x;          /* n_tok rows of w->ne[0] floats, x_stride floats apart */
    int64_t           x_stride;
    int32_t           n_tok;
    float *           y;          /* n_tok rows of w->ne[1] floats, y_stride floats apart */
    int64_t           y_stride;
    int32_t           accumulate; /* y += W x instead of y = W x */
} rm_matmul_args;

typedef struct rm_attn_args {
    const float * q;              /* n_tok rows of n_head*head_dim */
    const float * k_cache;        /* n_ctx rows of n_head_kv*head_dim: this layer's cache */
    const float * v_cache;
    float *       out;            /* n_tok rows of n_head*head_dim */
    int32_t       n_tok;
    int32_t       pos0;           /* position of the first token; token t sees positions [0, pos0 + t] */
    int32_t       n_head, n_head_kv, head_dim;
} rm_attn_args;

struct rm_backend {
    const char * name;
    void * ctx;
    /* y = W x for n_tok tokens (the CPU one reads each weight row once per batch). */
    void (*matmul)(rm_backend * be, const rm_matmul_args * a);
    /* Causal attention over the cache for n_tok consecutive tokens. */
    void (*attention)(rm_backend * be, const rm_attn_args * a);
};

/* The CPU backend, running on the model's thread pool; scratch sized for n_batch tokens of at
 * most max_in inputs and n_ctx positions. */
rm_backend * rm_backend_cpu_new(rm_pool * pool, int32_t n_batch, int64_t max_in, int32_t n_ctx);
void         rm_backend_cpu_free(rm_backend * be);

/* Small elementwise ops, the same on every backend's host side. */
void rm_rmsnorm(float * y, const float * x, const float * w, int64_t n, float eps);
void rm_rope(float * x, int32_t n_head, int32_t head_dim, int32_t n_rot, int32_t pos, float base, int neox);
void rm_softmax(float * x, int64_t n);

#endif
