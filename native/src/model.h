/* model.h - internal: the loaded model, its weights and hyperparameters. */
#ifndef RM_MODEL_H
#define RM_MODEL_H

#include <pthread.h>

#include "arch.h"
#include "rapidmoe.h"
#include "threads.h"

/* A weight tensor inside a mapped file. A 3-D expert tensor holds ne[2] matrices of ne[1] rows. */
typedef struct rm_weight {
    int32_t         type;
    int64_t         ne[4];
    const uint8_t * data;         /* NULL when the tensor is absent */
    uint64_t        row_bytes;    /* bytes of one row of ne[0] elements */
} rm_weight;

static inline const uint8_t * rm_weight_matrix(const rm_weight * w, int64_t i) {
    return w->data + (uint64_t) i * (uint64_t) w->ne[1] * w->row_bytes;
}

typedef struct rm_layer {
    rm_weight attn_norm;                 /* ne = {n_embd} */
    rm_weight wq, wk, wv;                /* ne = {n_embd, n_head*head_dim}, {n_embd, n_head_kv*head_dim} */
    rm_weight bq, bk, bv;                /* optional biases, ne = {n_out} */
    rm_weight q_norm, k_norm;            /* ne = {head_dim} (per head) or {n_head*head_dim} (full) */
    rm_weight wo;                        /* ne = {n_head*head_dim, n_embd} */
    rm_weight ffn_norm;                  /* ne = {n_embd} */
    rm_weight router;                    /* ne = {n_embd, n_expert} */
    rm_weight gate_exps, up_exps;        /* ne = {n_embd, n_ff_exp, n_expert} */
    rm_weight down_exps;                 /* ne = {n_ff_exp, n_embd, n_expert} */
    rm_weight gate_res, up_res, down_res;/* residuals, same shapes as their bases; absent without sidecar */
    rm_weight gate_shexp, up_shexp;      /* ne = {n_embd, n_ff_shexp} */
    rm_weight down_shexp;                /* ne = {n_ff_shexp, n_embd} */
    rm_weight gate_inp_shexp;            /* ne = {n_embd} */
} rm_layer;

typedef struct rm_hparams {
    int32_t n_vocab, n_embd, n_layer;
    int32_t n_head, n_head_kv, head_dim, n_rot;
    int32_t n_expert, n_expert_used, n_ff_exp, n_ff_shexp;
    int32_t n_ctx_train;
    int32_t norm_topk;
    float   rms_eps;
    float   rope_base;
} rm_hparams;

struct rm_model {
    const rm_arch * arch;
    rm_hparams      hp;
    rm_gguf *       base;
    rm_gguf *       residual;            /* NULL without sidecar */
    rm_weight       tok_embd;            /* ne = {n_embd, n_vocab} */
    rm_weight       output_norm;         /* ne = {n_embd} */
    rm_weight       output;              /* ne = {n_embd, n_vocab}; tok_embd when tied */
    rm_layer *      layers;
    rm_pool *       pool;
    pthread_mutex_t lock;                /* one evaluation at a time per model */
    rm_model_info   info;
    const struct rm_device_ops * device; /* where the model runs (device.h) */
    void *          device_state;        /* the device's: its copies of the weights */
    rm_gpu_info     gpu_info;            /* where the model runs, and why */
};

#endif
