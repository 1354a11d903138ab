/* arch.c - the architecture table. Behaviour that llama.cpp hard-codes per architecture (and that
 * therefore is not in the file) lives here. */
#include <string.h>

#include "arch.h"

static const rm_arch ARCHS[] = {
    /* Mixtral: softmax top-k, renormalised; interleaved RoPE (q/k permuted by the converter). */
    { "llama",    RM_QK_NORM_NONE,     RM_ROPE_NORM, RM_SHEXP_NONE,  1, "feed_forward_length" },
    /* Qwen1.5/Qwen2-MoE: no renormalisation; a shared expert behind a sigmoid gate. */
    { "qwen2moe", RM_QK_NORM_NONE,     RM_ROPE_NEOX, RM_SHEXP_GATED, 0, "expert_feed_forward_length" },
    /* Qwen3-MoE: per-head q/k RMSNorm; llama.cpp always renormalises. */
    { "qwen3moe", RM_QK_NORM_PER_HEAD, RM_ROPE_NEOX, RM_SHEXP_NONE,  1, "expert_feed_forward_length" },
    /* OLMoE: q/k RMSNorm over the full projection width. */
    { "olmoe",    RM_QK_NORM_FULL,     RM_ROPE_NEOX, RM_SHEXP_NONE,  0, "feed_forward_length" },
};

const rm_arch * rm_arch_find(const char * name, size_t len) {
    for (size_t i = 0; i < sizeof(ARCHS) / sizeof(ARCHS[0]); i++) {
        if (strlen(ARCHS[i].name) == len && memcmp(ARCHS[i].name, name, len) == 0) {
            return &ARCHS[i];
        }
    }
    return NULL;
}
