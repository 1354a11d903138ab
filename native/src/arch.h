/* arch.h - the architectures the runtime runs, as rows of a table.
 *
 * One generic forward pass (model.c) reads these flags at a few marked points; an architecture
 * whose math differs more than a flag can say gets its own function, not more flags. */
#ifndef RM_ARCH_H
#define RM_ARCH_H

#include <stddef.h>

typedef enum rm_qk_norm {
    RM_QK_NORM_NONE     = 0,
    RM_QK_NORM_PER_HEAD = 1,   /* RMSNorm over each head, weight ne = {head_dim} (Qwen3) */
    RM_QK_NORM_FULL     = 2,   /* RMSNorm over all of q (resp. k), weight ne = {n_head*head_dim} (OLMoE) */
} rm_qk_norm;

typedef enum rm_rope_kind {
    RM_ROPE_NORM = 0,          /* rotate pairs (x[2i], x[2i+1]): llama.cpp's llama arch, q/k rows permuted at conversion */
    RM_ROPE_NEOX = 1,          /* rotate pairs (x[i], x[i + n_rot/2]) */
} rm_rope_kind;

typedef enum rm_shared_expert {
    RM_SHEXP_NONE  = 0,
    RM_SHEXP_GATED = 1,        /* out += sigmoid(gate_inp_shexp . x) * ffn_shexp(x) (Qwen2-MoE) */
} rm_shared_expert;

typedef struct rm_arch {
    const char *     name;          /* general.architecture */
    rm_qk_norm       qk_norm;
    rm_rope_kind     rope;
    rm_shared_expert shared_expert;
    int              norm_topk;     /* renormalise the top-k weights, unless {arch}.expert_weights_norm says otherwise */
    const char *     ff_exp_key;    /* key suffix holding the experts' FFN width */
} rm_arch;

/* NULL when the architecture is not supported. */
const rm_arch * rm_arch_find(const char * name, size_t len);

#endif
