/* test_arch.c - the architecture table's parts that today's rows do not exercise through a model:
 * layer-kind rules (a row of the DeepSeek kind, with leading dense layers, or of the gpt-oss
 * kind, with a sliding-window pattern), the kind matching that picks a layer's tensors, and the
 * words the loader's refusal uses; and the public description's bounds. The table is internal,
 * so this test compiles its own copy of arch.c (and of status.c for the error messages). */
#include <stdio.h>
#include <string.h>

#include "../src/model/arch.c"
#include "../src/status.c"
#include "expect.h"

static const rm_kind_rule DENSE_LEAD[] = {
    {RM_RULE_FIRST_N, HPOFF(n_layer_dense_lead), RM_LAYER_FFN_MOE, RM_LAYER_FFN_DENSE},
};
static const rm_kind_rule SWA_PATTERN[] = {
    {RM_RULE_NOT_EVERY_N, HPOFF(n_layer_dense_lead), RM_LAYER_ATTN_FULL, RM_LAYER_ATTN_SLIDING},
};

static void test_rules(void) {
    rm_arch a = *rm_arch_find("qwen2moe", 8);
    rm_hparams hp = {0};
    hp.n_layer_dense_lead = 2;
    a.rules = DENSE_LEAD;
    a.n_rules = 1;
    for (int il = 0; il < 4; il++) {
        const uint32_t k = rm_arch_layer_kind(&a, &hp, il);
        const uint32_t ffn = il < 2 ? RM_LAYER_FFN_DENSE : RM_LAYER_FFN_MOE;
        EXPECT(k == (RM_LAYER_ATTN_FULL | ffn | RM_LAYER_SHEXP), "dense lead: layer %d kind 0x%x", il, k);
        EXPECT(rm_layer_kind_has(k, RM_LAYER_FFN_MOE) == (il >= 2), "layer %d: routed experts", il);
    }
    char what[128];
    /* dense FFNs run; a kind the forward pass lacks is named (every named kind runs today, so by its bit) */
    const uint32_t unknown = 0x8000u;
    EXPECT((unknown & (uint32_t) RM_LAYER_RUNS) == 0, "bit 0x8000 is no kind the forward pass runs");
    rm_layer_kind_unsupported(rm_arch_layer_kind(&a, &hp, 0) | unknown, what, sizeof(what));
    EXPECT(strcmp(what, "kind 0x8000") == 0, "refusal words '%s'", what);

    a.rules = SWA_PATTERN;
    hp.n_layer_dense_lead = 2;   /* the pattern's period here: even layers slide */
    for (int il = 0; il < 4; il++) {
        const uint32_t k = rm_arch_layer_kind(&a, &hp, il);
        const uint32_t attn = il % 2 == 0 ? RM_LAYER_ATTN_SLIDING : RM_LAYER_ATTN_FULL;
        EXPECT((k & (RM_LAYER_ATTN_FULL | RM_LAYER_ATTN_SLIDING)) == attn, "swa: layer %d kind 0x%x", il, k);
        /* plain attention tensors belong to both kinds */
        EXPECT(rm_layer_kind_has(k, RM_LAYER_ATTN_FULL | RM_LAYER_ATTN_SLIDING), "layer %d: q/k/v", il);
    }
    hp.n_layer_dense_lead = 0;   /* no period: every layer as the row says */
    EXPECT(rm_arch_layer_kind(&a, &hp, 0) & RM_LAYER_ATTN_FULL, "swa off");
    /* sliding windows and sinks run (gpt-oss), dense FFNs and MLA too (DeepSeek/GLM), linear
     * attention (the Qwen3.5 hybrids): only the rest is named */
    const uint32_t runs = RM_LAYER_ATTN_SLIDING | RM_LAYER_FFN_DENSE | RM_LAYER_SINKS | RM_LAYER_ATTN_MLA |
                          RM_LAYER_ATTN_LINEAR;
    EXPECT((runs & ~(uint32_t) RM_LAYER_RUNS) == 0, "sliding windows, dense FFNs, sinks, MLA and linear attention run");
    rm_layer_kind_unsupported(runs | unknown, what, sizeof(what));
    EXPECT(strcmp(what, "kind 0x8000") == 0, "refusal words '%s'", what);
}

static void test_kind_matching(void) {
    const uint32_t k = RM_LAYER_ATTN_FULL | RM_LAYER_FFN_MOE | RM_LAYER_QK_NORM_HEAD;
    EXPECT(rm_layer_kind_has(k, 0), "a row for every layer");
    EXPECT(rm_layer_kind_has(k, RM_LAYER_QK_NORM_HEAD), "a feature the layer has");
    EXPECT(!rm_layer_kind_has(k, RM_LAYER_QK_NORM_FULL), "a feature it lacks");
    EXPECT(!rm_layer_kind_has(k, RM_LAYER_ATTN_MLA), "another attention kind");
    EXPECT(!rm_layer_kind_has(k, RM_LAYER_FFN_MOE | RM_LAYER_SHEXP), "kind and a missing feature");
    for (int32_t i = 0; i < rm_arch_count(); i++) {
        rm_arch_info ai;
        EXPECT(rm_arch_describe(i, &ai) == RM_OK, "describe %d", i);
        EXPECT((ai.layer_kind & ~(uint32_t) RM_LAYER_RUNS) == 0, "%s: a plain layer runs", ai.name);
        const rm_arch * a = rm_arch_find(ai.name, strlen(ai.name));
        rm_hparams hp = {0};
        EXPECT(a && rm_arch_layer_kind(a, &hp, 0) == ai.layer_kind, "%s: kind", ai.name);
    }
}

static void test_describe_bounds(void) {
    rm_arch_info ai;
    rm_arch_hparam_info hi;
    rm_arch_tensor_info ti;
    EXPECT(rm_arch_describe(-1, &ai) == RM_E_INVALID_ARG, "arch -1");
    EXPECT(rm_arch_describe(rm_arch_count(), &ai) == RM_E_INVALID_ARG, "arch count");
    EXPECT(rm_arch_describe(0, NULL) == RM_E_INVALID_ARG, "NULL out");
    EXPECT(rm_arch_describe(0, &ai) == RM_OK, "arch 0");
    EXPECT(rm_arch_hparam_describe(0, ai.n_hparams, &hi) == RM_E_INVALID_ARG, "hparam past the end");
    EXPECT(rm_arch_tensor_describe(0, ai.n_tensors, &ti) == RM_E_INVALID_ARG, "tensor past the end");
    EXPECT(strstr(rm_last_error(), "no tensor template") != NULL, "message '%s'", rm_last_error());
    EXPECT(rm_arch_hparam_describe(0, 4, &hi) == RM_OK && strcmp(hi.key, "attention.key_length") == 0 &&
               strcmp(hi.dflt, "n_embd/n_head") == 0 && strcmp(hi.max, "65536") == 0,
           "key_length row: %s %s %s", hi.key, hi.dflt, hi.max);
    char list[512];
    rm_arch_supported_list(list, sizeof(list));
    EXPECT(strcmp(list, "llama (Mixtral), qwen2moe, qwen3moe, olmoe, qwen35moe, qwen3next, qwen4exp (Qwen3.8-Flash-Next), "
                         "glm4moe (GLM-4.5), "
                         "deepseek2 (DeepSeek-V2/V3), glm-dsa (GLM-5), deepseek32 (DeepSeek-V3.2), gpt-oss, minimax-m2 (MiniMax-M2), mimo2 (MiMo-V2-Flash), gemma4 (Gemma 4), "
                         "step35 (Step-3.5-Flash), deepseek4 (DeepSeek-V4)") == 0, "list '%s'", list);
}

int main(void) {
    test_rules();
    test_kind_matching();
    test_describe_bounds();
    printf("test_arch: %d passed, %d failed\n", n_passed, n_failed);
    return n_failed != 0;
}
