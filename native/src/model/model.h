/* model.h - internal: the loaded model, its weights and hyperparameters. */
#ifndef RM_MODEL_H
#define RM_MODEL_H

#include <pthread.h>

#include "arch.h"
#include "rapidmoe.h"
#include "threads.h"
#include "weights.h"

struct rm_model {
    const rm_arch * arch;
    rm_hparams      hp;
    rm_gguf *       base;
    rm_gguf *       residual;            /* NULL without sidecar */
    rm_weight       tok_embd;            /* ne = {n_embd, n_vocab} */
    rm_weight       output_norm;         /* ne = {n_embd} */
    rm_weight       output;              /* ne = {n_embd, n_vocab}; tok_embd when tied */
    rm_hc           hc_head;             /* RM_ARCH_HYPER: the streams' final mixer, in place of output_norm */
    rm_mhc          mhc_head;            /* RM_ARCH_MHC: the streams' final weights (fn, base, scale ne = {1}) */
    rm_weight       ple_embd;            /* ne = {n_embd_per_layer, rows}: every PLE layer's hashed n-gram rows
                                            (per_layer_token_embd), each layer's heads at their offsets; absent
                                            without PLE layers */
    rm_weight       rope_freqs;          /* ne = {n_rot / 2}: the full-attention layers' RoPE frequencies divided
                                            by these (Gemma 4's proportional RoPE); absent: none */
    rm_layer *      layers;
    float *         float_copies;        /* the F32 copies of the float-read tensors a file holds in another type */
    rm_pool *       pool;
    pthread_mutex_t lock;                /* one evaluation at a time per model */
    rm_model_info   info;
    const struct rm_device_ops * device; /* where the model runs (device.h) */
    void *          device_state;        /* the device's: its copies of the weights */
    rm_gpu_info     gpu_info;            /* where the model runs, and why */
    struct rm_xcache * xcache;           /* RM_LOAD_STREAM: the routed experts' cache (xcache.h); else NULL */
    uint64_t        ram_budget;          /* with xcache: the weights' budget, and the part kept resident */
    uint64_t        resident_bytes;
};

/* The widest row of any matrix the model's products read (ne[0]): the backends size their quantized
 * activations by it. */
int64_t rm_model_widest_row(const rm_model * m);

#endif
