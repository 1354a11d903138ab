/* model.c - loading a model: hyperparameters from the keys, weights from the tensors, both by
 * walking the architecture's rows (arch.c); nothing here is written per architecture.
 *
 * Nothing in the file is trusted: every tensor the forward pass touches is checked for presence,
 * type and shape here, so the forward pass itself needs no checks. */
#include "model.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "device.h"
#include "gguf.h"
#include "sizes.h"
#include "status.h"
#include "types.h"
#include "xcache.h"

/* Reading one file's keys: for rm_model_load and rm_arch_read_hparams, whose names the messages carry. */
typedef struct loader {
    const char *    fn;
    const char *    path;
    const rm_gguf * g;
    const rm_arch * arch;
} loader;

/* Reads an integer (or bool) key {arch}.{suffix}: 1 found, 0 absent, -1 unusable (error set). */
static int get_int(const loader * ld, const char * suffix, int64_t * out) {
    char key[128];
    snprintf(key, sizeof(key), "%s.%s", ld->arch->name, suffix);
    rm_status st = rm_gguf_get_i64(ld->g, key, out);
    if (st == RM_E_FORMAT && rm_gguf_kv_type(ld->g, rm_gguf_find_kv(ld->g, key)) == RM_GGUF_BOOL) {
        bool b;
        st = rm_gguf_get_bool(ld->g, key, &b);
        *out = b;
    }
    return st == RM_OK ? 1 : st == RM_GGUF_MISSING ? 0 : -1;
}

static int get_float(const loader * ld, const char * suffix, float * out) {
    char key[128];
    snprintf(key, sizeof(key), "%s.%s", ld->arch->name, suffix);
    rm_status st = rm_gguf_get_f32(ld->g, key, out);
    return st == RM_OK ? 1 : st == RM_GGUF_MISSING ? 0 : -1;
}

/* The arch's per-layer list of sliding layers (rm_arch.swa_layers_key: bools, or 32-bit integers
 * as llama.cpp writes MiMo's) into hp->layer_swa, once block_count is known: 1 read (or none to
 * read), 0 on a damaged list (error set). */
static int read_layer_swa(const loader * ld, rm_hparams * hp) {
    if (hp->layer_swa || !ld->arch->swa_layers_key) {
        return 1;
    }
    char key[128];
    snprintf(key, sizeof(key), "%s.%s", ld->arch->name, ld->arch->swa_layers_key);
    rm_gguf_arr arr;
    const rm_status st = rm_gguf_get_arr(ld->g, key, -1, &arr);
    if (st == RM_GGUF_MISSING) {
        return 1;   /* no layer slides */
    }
    const int bytes = st != RM_OK ? 0 : arr.type == RM_GGUF_BOOL ? 1
                      : arr.type == RM_GGUF_INT32 || arr.type == RM_GGUF_UINT32 ? 4 : 0;
    if (!bytes || hp->n_layer <= 0 || arr.n < (uint64_t) hp->n_layer) {
        rm_fail(RM_E_FORMAT, "%s: %s: '%s' must be an array of bools or 32-bit integers of at least block_count (%d) "
                "entries", ld->fn, ld->path, key, hp->n_layer);
        return 0;
    }
    hp->layer_swa = arr.data;
    hp->layer_swa_bytes = bytes;
    return 1;
}

/* The arch's per-layer list of the layers that run their own sparse-attention indexer
 * (rm_arch.indexer_layers_key, bools) into hp->layer_indexer, once block_count is known: 1 read (or
 * none to read: every layer runs its own, as llama.cpp reads a GLM-5 file without the list), 0 on a
 * damaged list (error set). */
static int read_layer_indexer(const loader * ld, rm_hparams * hp) {
    if (hp->layer_indexer || !ld->arch->indexer_layers_key) {
        return 1;
    }
    char key[128];
    snprintf(key, sizeof(key), "%s.%s", ld->arch->name, ld->arch->indexer_layers_key);
    rm_gguf_arr arr;
    const rm_status st = rm_gguf_get_arr(ld->g, key, RM_GGUF_BOOL, &arr);
    if (st == RM_GGUF_MISSING) {
        return 1;
    }
    const int32_t n = hp->n_layer - hp->n_layer_nextn;   /* the prediction layers may have no entry */
    if (st != RM_OK || n <= 0 || arr.n < (uint64_t) n) {
        rm_fail(RM_E_FORMAT, "%s: %s: '%s' must be an array of bools, one per layer (%d)", ld->fn, ld->path, key, n);
        return 0;
    }
    hp->layer_indexer = arr.data;
    return 1;
}

/* The arch's per-layer compress ratios (rm_arch.ratio_layers_key: 32-bit integers, DeepSeek-V4's)
 * into hp->layer_ratio, once block_count is known; refused when missing, damaged or a ratio other
 * than 0, 4 and 128 (the layer kinds and llama.cpp's tensors have those alone). */
static rm_status read_layer_ratio(const loader * ld, rm_hparams * hp) {
    if (hp->layer_ratio || !ld->arch->ratio_layers_key) {
        return RM_OK;
    }
    char key[128];
    snprintf(key, sizeof(key), "%s.%s", ld->arch->name, ld->arch->ratio_layers_key);
    rm_gguf_arr arr;
    const rm_status st = rm_gguf_get_arr(ld->g, key, -1, &arr);
    if (st != RM_OK || (arr.type != RM_GGUF_INT32 && arr.type != RM_GGUF_UINT32) || hp->n_layer <= 0 ||
        arr.n < (uint64_t) hp->n_layer) {
        return rm_fail(RM_E_FORMAT, "%s: %s: '%s' must be an array of 32-bit integers of at least block_count (%d) "
                       "entries", ld->fn, ld->path, key, hp->n_layer);
    }
    for (int32_t il = 0; il < hp->n_layer; il++) {
        int32_t r;
        memcpy(&r, (const uint8_t *) arr.data + 4 * (size_t) il, sizeof(r));
        if (r != 0 && r != 4 && r != 128) {
            return rm_fail(RM_E_UNSUPPORTED_ARCH, "%s: %s: '%s' gives layer %d the ratio %d: the layers compress by 0, "
                           "4 or 128 (llama.cpp's only ones)", ld->fn, ld->path, key, il, (int) r);
        }
    }
    hp->layer_ratio = arr.data;
    return RM_OK;
}

/* A row's key given as a per-layer array (Gemma 4's head_count_kv): every sliding layer's value
 * into the row's off_swa field, every other layer's into its field; each kind must have one value.
 * 1 read, 0 not an array, -1 unusable (error set). */
static int get_int_per_layer(const loader * ld, const rm_hparam_row * h, rm_hparams * hp) {
    char key[128];
    snprintf(key, sizeof(key), "%s.%s", ld->arch->name, h->key);
    const int64_t ik = rm_gguf_find_kv(ld->g, key);
    if (!h->off_swa || ik < 0 || rm_gguf_kv_type(ld->g, ik) != RM_GGUF_ARRAY) {
        return 0;
    }
    rm_gguf_arr arr;
    if (!read_layer_swa(ld, hp)) {
        return -1;
    }
    if (rm_gguf_get_arr(ld->g, key, -1, &arr) != RM_OK || arr.n < (uint64_t) hp->n_layer ||
        (arr.type != RM_GGUF_UINT32 && arr.type != RM_GGUF_INT32)) {
        rm_fail(RM_E_FORMAT, "%s: %s: '%s' must be an integer or an array of block_count (%d) 32-bit integers",
                ld->fn, ld->path, key, hp->n_layer);
        return -1;
    }
    int64_t v[2] = {-1, -1};   /* the other layers', the sliding layers' */
    for (int il = 0; il < hp->n_layer; il++) {
        const int64_t x = arr.type == RM_GGUF_UINT32 ? (int64_t) ((const uint32_t *) arr.data)[il]
                                                     : (int64_t) ((const int32_t *) arr.data)[il];
        const int slides = rm_hp_slides(hp, il);
        if (v[slides] >= 0 && v[slides] != x) {
            rm_fail(RM_E_UNSUPPORTED_ARCH, "%s: %s: '%s' gives layer %d %lld and an earlier %s layer %lld: the forward "
                    "pass runs one value for the sliding layers and one for the others", ld->fn, ld->path, key, il,
                    (long long) x, slides ? "sliding" : "full-attention", (long long) v[slides]);
            return -1;
        }
        v[slides] = x;
    }
    const int64_t lo = h->min.op ? (int64_t) rm_expr_eval(&h->min, hp) : 1;
    const int64_t hi = h->max.op ? (int64_t) rm_expr_eval(&h->max, hp) : INT32_MAX;
    for (int k = 0; k < 2; k++) {
        if (v[k] >= 0 && (v[k] < lo || v[k] > hi)) {
            rm_fail(RM_E_FORMAT, "%s: %s: '%s' holds %lld, outside [%lld, %lld]", ld->fn, ld->path, key,
                    (long long) v[k], (long long) lo, (long long) hi);
            return -1;
        }
    }
    const int32_t full = (int32_t) (v[0] >= 0 ? v[0] : v[1]), swa = (int32_t) (v[1] >= 0 ? v[1] : v[0]);
    memcpy((char *) hp + h->off, &full, sizeof(full));
    memcpy((char *) hp + h->off_swa, &swa, sizeof(swa));
    return 1;
}

/* Reads one hyperparameter row into its field of hp. Integers must lie in the row's range
 * (RM_E_FORMAT) and in what the forward pass runs (RM_E_UNSUPPORTED_ARCH); floats must be finite
 * and positive (a NaN or infinite epsilon or RoPE base would turn every logit into NaN). */
static rm_status read_hparam(const loader * ld, const rm_hparam_row * h, rm_hparams * hp) {
    char * field = (char *) hp + h->off;
    if (h->kind == RM_HPARAM_FLOAT) {
        float v = (float) rm_expr_eval(&h->dflt, hp);
        if (get_float(ld, h->key, &v) < 0) {
            return RM_E_FORMAT;
        }
        if (!isfinite(v) || !(v > 0.0f)) {
            return rm_fail(RM_E_FORMAT, "%s: %s: key '%s.%s' = %g is not a finite positive number",
                           ld->fn, ld->path, ld->arch->name, h->key, (double) v);
        }
        memcpy(field, &v, sizeof(v));
        return RM_OK;
    }
    const int per_layer = get_int_per_layer(ld, h, hp);
    if (per_layer != 0) {
        return per_layer > 0 ? RM_OK : RM_E_FORMAT;
    }
    int64_t v = (int64_t) rm_expr_eval(&h->dflt, hp);
    int r = get_int(ld, h->key, &v);
    if (r < 0) {
        return RM_E_FORMAT;
    }
    if (r == 0 && h->dflt.op == RM_EXPR_NONE) {
        return rm_fail(RM_E_FORMAT, "%s: %s: required key '%s.%s' is missing%s%s%s", ld->fn, ld->path, ld->arch->name,
                       h->key, h->run_why ? " (" : "", h->run_why ? h->run_why : "", h->run_why ? ")" : "");
    }
    const int64_t lo = h->min.op ? (int64_t) rm_expr_eval(&h->min, hp) : INT64_MIN;
    const int64_t hi = h->max.op ? (int64_t) rm_expr_eval(&h->max, hp) : INT64_MAX;
    if (v < lo || v > hi) {
        return rm_fail(RM_E_FORMAT, "%s: %s: key '%s.%s' = %lld is outside [%lld, %lld]",
                       ld->fn, ld->path, ld->arch->name, h->key, (long long) v, (long long) lo, (long long) hi);
    }
    const int64_t run_lo = h->run_min.op ? (int64_t) rm_expr_eval(&h->run_min, hp) : INT32_MIN;
    const int64_t run_hi = h->run_max.op ? (int64_t) rm_expr_eval(&h->run_max, hp) : INT32_MAX;
    if (v < run_lo || v > run_hi) {
        return rm_fail(RM_E_UNSUPPORTED_ARCH, "%s: %s: key '%s.%s' = %lld is not supported: the forward "
                       "pass runs [%lld, %lld] (%s)", ld->fn, ld->path, ld->arch->name, h->key, (long long) v, (long long) run_lo,
                       (long long) run_hi, h->run_why ? h->run_why : "");
    }
    const int32_t v32 = (int32_t) v;
    memcpy(field, &v32, sizeof(v32));
    if (h->off_swa) {
        memcpy((char *) hp + h->off_swa, &v32, sizeof(v32));   /* one value for every layer */
    }
    return RM_OK;
}

/* Looks a tensor up and checks its shape: a wanted dim > 0 must match, 0 means any, -1 means 1. */
static rm_status bind(rm_gguf * g, const char * path, const char * name, int required,
                      int64_t ne0, int64_t ne1, int64_t ne2, rm_weight * w) {
    memset(w, 0, sizeof(*w));
    int64_t i = rm_gguf_find_tensor(g, name);
    if (i < 0) {
        if (required) {
            return rm_fail(RM_E_FORMAT, "rm_model_load: %s: tensor '%s' is missing", path, name);
        }
        return RM_OK;
    }
    rm_tensor_info ti;
    rm_status st = rm_gguf_tensor_info(g, i, &ti);
    if (st != RM_OK) {
        return st;
    }
    const rm_type_traits * tt = rm_type_traits_get(ti.type);
    if (ti.type != RM_TYPE_I32 && (!tt || (tt->is_quantized && !tt->vec_dot))) {   /* I32: a table (load_dsv4) */
        return rm_fail(RM_E_UNSUPPORTED_TYPE, "rm_model_load: %s: tensor '%s' has ggml type %d, not supported",
                       path, name, ti.type);
    }
    const int64_t want[3] = {ne0, ne1 < 0 ? 1 : ne1, ne2 < 0 ? 1 : ne2};
    for (int d = 0; d < 3; d++) {
        if (want[d] > 0 && ti.ne[d] != want[d]) {
            return rm_fail(RM_E_SHAPE,
                           "rm_model_load: %s: tensor '%s' has ne = {%lld, %lld, %lld, %lld}, expected {%lld, %lld, %lld}",
                           path, name, (long long) ti.ne[0], (long long) ti.ne[1], (long long) ti.ne[2],
                           (long long) ti.ne[3], (long long) want[0], (long long) want[1], (long long) want[2]);
        }
    }
    if (ti.ne[3] != 1) {
        return rm_fail(RM_E_SHAPE, "rm_model_load: %s: tensor '%s' is 4-D", path, name);
    }
    w->type = ti.type;
    memcpy(w->ne, ti.ne, sizeof(w->ne));
    w->data = ti.data;
    w->row_bytes = ti.type == RM_TYPE_I32 ? sizeof(int32_t) * (uint64_t) ti.ne[0] : rm_row_bytes(ti.type, ti.ne[0]);
    return RM_OK;
}

/* The row of the file's general.architecture. */
static rm_status find_arch(loader * ld) {
    const int64_t ia = rm_gguf_find_kv(ld->g, "general.architecture");
    if (ia < 0 || rm_gguf_kv_type(ld->g, ia) != RM_GGUF_STRING) {
        return rm_fail(RM_E_FORMAT, "%s: %s: 'general.architecture' is missing or not a string", ld->fn, ld->path);
    }
    const rm_str an = rm_gguf_kv_str(ld->g, ia);
    ld->arch = rm_arch_find(an.ptr, an.len);
    if (!ld->arch) {
        char supported[512];
        rm_arch_supported_list(supported, sizeof(supported));
        return rm_fail(RM_E_UNSUPPORTED_ARCH, "%s: %s: architecture '%.*s' is not supported (supported: %s)", ld->fn,
                       ld->path, (int) (an.len > 64 ? 64 : an.len), an.ptr, supported);
    }
    return RM_OK;
}

/* YaRN as llama.cpp reads it for deepseek2: rope.scaling.type "yarn", its factor and original
 * context, and yarn_log_multiplier (0.1 * DeepSeek's mscale_all_dim, which llama.cpp divides back).
 * With the multiplier, cos/sin keep their scale (llama.cpp takes mscale = mscale_all_dim) and the
 * attention logits get mscale(factor, mscale_all_dim)^2; without it both get mscale(factor, 1). */
static float yarn_mscale(float factor, float m) { return factor <= 1.0f ? 1.0f : 0.1f * m * logf(factor) + 1.0f; }

static rm_status read_rope_scaling(const loader * ld, rm_hparams * hp) {
    char key[128];
    snprintf(key, sizeof(key), "%s.rope.scaling.type", ld->arch->name);
    rm_str type;
    if (rm_gguf_get_str(ld->g, key, &type) != RM_OK || (type.len == 4 && memcmp(type.ptr, "none", 4) == 0)) {
        return RM_OK;   /* absent or none: plain RoPE */
    }
    if (hp->rope_yarn_factor > 0.0f) {
        return RM_OK;   /* the row reads YaRN's keys itself (gpt-oss) */
    }
    if (type.len != 4 || memcmp(type.ptr, "yarn", 4) != 0 || hp->kv_lora_rank == 0) {
        return rm_fail(RM_E_UNSUPPORTED_ARCH, "%s: %s: rope scaling '%.*s' is not supported (YaRN runs for "
                       "deepseek2's latent attention only)", ld->fn, ld->path, (int) (type.len > 32 ? 32 : type.len), type.ptr);
    }
    float factor = 1.0f, log_mul = 0.0f;
    int64_t orig = hp->n_ctx_train;
    if (get_float(ld, "rope.scaling.factor", &factor) < 0 || get_int(ld, "rope.scaling.original_context_length", &orig) < 0 ||
        get_float(ld, "rope.scaling.yarn_log_multiplier", &log_mul) < 0) {
        return RM_E_FORMAT;
    }
    if (!isfinite(factor) || factor < 1.0f || orig < 1 || orig > (1 << 24) || !isfinite(log_mul) || log_mul < 0.0f) {
        return rm_fail(RM_E_FORMAT, "%s: %s: YaRN factor %g, original context %lld, log multiplier %g out of range",
                       ld->fn, ld->path, (double) factor, (long long) orig, (double) log_mul);
    }
    const float mscale_all = log_mul / 0.1f;
    const float m = mscale_all > 0.0f ? yarn_mscale(factor, mscale_all) : yarn_mscale(factor, 1.0f);
    hp->rope_yarn_factor = factor;
    hp->n_ctx_orig_yarn = (int32_t) orig;
    hp->yarn_beta_fast = 32.0f;   /* llama.cpp's deepseek2 takes these, whatever the file says */
    hp->yarn_beta_slow = 1.0f;
    hp->yarn_rope_mult = mscale_all > 0.0f ? 1.0f : m;
    hp->kq_scale = m * m / sqrtf((float) hp->head_dim);
    return RM_OK;
}

/* The values the DeepSeek/GLM rows imply rather than state (0 in today's rows, which then keep
 * theirs): the shared experts' total width, the layers without the next-token-prediction ones,
 * and the checks that tie the expert groups and MLA's head split together. */
static rm_status derive_hparams(const loader * ld, rm_hparams * hp) {
    /* the sliding layers' shape is the others' where no row reads it */
    hp->n_head_swa = hp->n_head_swa > 0 ? hp->n_head_swa : hp->n_head;
    hp->n_head_kv_swa = hp->n_head_kv_swa > 0 ? hp->n_head_kv_swa : hp->n_head_kv;
    hp->head_dim_swa = hp->head_dim_swa > 0 ? hp->head_dim_swa : hp->head_dim;
    if (ld->arch->flags & RM_ARCH_FULL_ROT_HALF) {   /* llama.cpp's step35: the full layers turn half */
        hp->n_rot_swa = hp->n_rot;
        hp->n_rot = hp->n_rot / 2;
        if (hp->n_rot % 2 != 0) {
            return rm_fail(RM_E_FORMAT, "%s: %s: rope.dimension_count %d: the full layers' half of it must be even",
                           ld->fn, ld->path, hp->n_rot_swa);
        }
    }
    hp->n_rot_swa = hp->n_rot_swa > 0 ? hp->n_rot_swa : hp->n_rot;
    hp->rope_base_swa = hp->rope_base_swa > 0.0f ? hp->rope_base_swa : hp->rope_base;
    hp->head_dim_v = hp->head_dim_v > 0 ? hp->head_dim_v : hp->head_dim;
    if (hp->final_softcap >= 1e30f) {
        hp->final_softcap = 0.0f;   /* the row's default: the file sets no cap */
    }
    if (hp->n_head_swa % hp->n_head_kv_swa != 0 || hp->n_rot_swa % 2 != 0) {
        return rm_fail(RM_E_FORMAT, "%s: %s: the sliding layers' head_count_kv %d must divide their head_count %d and "
                       "their rope.dimension_count_swa %d be even", ld->fn, ld->path, hp->n_head_kv_swa, hp->n_head_swa,
                       hp->n_rot_swa);
    }
    if (hp->n_expert_shared > 0) {
        hp->n_ff_shexp = hp->n_ff_exp * hp->n_expert_shared;
    }
    if (hp->n_layer_nextn > 0) {
        if (hp->n_layer_nextn >= hp->n_layer) {
            return rm_fail(RM_E_FORMAT, "%s: %s: nextn_predict_layers %d leaves no layer of block_count %d", ld->fn,
                           ld->path, hp->n_layer_nextn, hp->n_layer);
        }
        hp->n_layer -= hp->n_layer_nextn;   /* the prediction layers come last; the forward pass skips them */
        if (hp->n_layer_dense_lead > hp->n_layer) {
            hp->n_layer_dense_lead = hp->n_layer;
        }
    }
    int64_t dense = 0;
    if ((ld->arch->flags & RM_ARCH_DENSE_BY_ROUTER) && get_int(ld, "leading_dense_block_count", &dense) == 0) {
        int32_t n = 0;   /* the leading layers without a router */
        for (char name[64]; n < hp->n_layer; n++) {
            snprintf(name, sizeof(name), "blk.%d.ffn_gate_inp.weight", n);
            if (rm_gguf_find_tensor(ld->g, name) >= 0) break;
        }
        hp->n_layer_dense_lead = n;
    }
    if (hp->n_group > 1 && hp->n_expert % hp->n_group != 0) {
        return rm_fail(RM_E_FORMAT, "%s: %s: expert_count %d is not a multiple of expert_group_count %d", ld->fn,
                       ld->path, hp->n_expert, hp->n_group);
    }
    if (hp->n_group > 1 && hp->n_group_used * (hp->n_expert / hp->n_group) < hp->n_expert_used) {
        return rm_fail(RM_E_FORMAT, "%s: %s: %d of %d expert groups hold fewer than expert_used_count %d experts",
                       ld->fn, ld->path, hp->n_group_used, hp->n_group, hp->n_expert_used);
    }
    if (hp->index_head_dim > 0) {   /* DeepSeek sparse attention */
        if (hp->layer_indexer && !hp->layer_indexer[0]) {
            return rm_fail(RM_E_FORMAT, "%s: %s: attention.indexer.types makes layer 0 take the positions of an "
                           "earlier indexed layer, and there is none", ld->fn, ld->path);
        }
        if (hp->index_head_dim < hp->n_rot) {
            return rm_fail(RM_E_FORMAT, "%s: %s: the indexer's key_length %d is shorter than rope.dimension_count %d",
                           ld->fn, ld->path, hp->index_head_dim, hp->n_rot);
        }
    }
    if (hp->kv_lora_rank > 0 && hp->q_lora_rank > hp->n_head * hp->kv_lora_rank) {
        return rm_fail(RM_E_UNSUPPORTED_ARCH, "%s: %s: q_lora_rank %d above head_count * kv_lora_rank %d is not supported",
                       ld->fn, ld->path, hp->q_lora_rank, hp->n_head * hp->kv_lora_rank);
    }
    if (hp->kv_lora_rank > 0 && hp->n_rot >= hp->head_dim) {
        return rm_fail(RM_E_FORMAT, "%s: %s: rope.dimension_count %d leaves no part without RoPE in key_length_mla %d",
                       ld->fn, ld->path, hp->n_rot, hp->head_dim);
    }
    return read_rope_scaling(ld, hp);
}

/* The counts of linear-attention and sliding-window layers (the caches' sizes), then for hybrid
 * rows (linear attention): shapes that fit together, and the
 * file's per-layer list (llama.cpp's attention.recurrent_layers), where present, agreeing with
 * the rule that gives the layers their kinds. */
static rm_status linear_hparams(const loader * ld, rm_hparams * hp) {
    hp->n_layer_linear = hp->n_layer_swa = hp->n_layer_csa = hp->n_layer_hca = 0;
    for (int il = 0; il < hp->n_layer; il++) {   /* by the layers' kinds, as the session lays out its caches */
        const uint32_t k = rm_arch_layer_kind(ld->arch, hp, il);
        hp->n_layer_linear += (k & RM_LAYER_ATTN_LINEAR) != 0;
        hp->n_layer_swa += hp->n_swa > 0 && (k & RM_LAYER_ATTN_SLIDING);
        hp->n_layer_csa += (k & RM_LAYER_CSA) != 0;
        hp->n_layer_hca += (k & RM_LAYER_HCA) != 0;
    }
    if (hp->ssm_n_v > 0 && (hp->ssm_n_v % hp->ssm_n_k != 0 || hp->ssm_d_inner % hp->ssm_n_v != 0)) {
        return rm_fail(RM_E_FORMAT, "%s: %s: ssm.time_step_rank %d must be a multiple of ssm.group_count %d, and "
                       "ssm.inner_size %d of ssm.time_step_rank", ld->fn, ld->path, hp->ssm_n_v, hp->ssm_n_k,
                       hp->ssm_d_inner);
    }
    if (hp->ssm_n_v > 0 && (hp->ssm_d_inner / hp->ssm_n_v > 1024 || hp->ssm_d_state > 1024)) {
        return rm_fail(RM_E_UNSUPPORTED_ARCH, "%s: %s: linear-attention heads of %d keys and %d values: the "
                       "delta rule runs heads of at most 1024", ld->fn, ld->path, hp->ssm_d_state,
                       hp->ssm_d_inner / hp->ssm_n_v);
    }
    if (!ld->arch->linear_layers_key) {
        return RM_OK;
    }
    char key[128];
    snprintf(key, sizeof(key), "%s.%s", ld->arch->name, ld->arch->linear_layers_key);
    rm_gguf_arr arr;
    rm_status st = rm_gguf_get_arr(ld->g, key, RM_GGUF_BOOL, &arr);
    if (st == RM_GGUF_MISSING) {
        return RM_OK;
    }
    if (st != RM_OK || arr.n < (uint64_t) hp->n_layer) {
        return rm_fail(RM_E_FORMAT, "%s: %s: '%s' must be a bool array of at least %d entries", ld->fn, ld->path, key,
                       hp->n_layer);
    }
    for (int il = 0; il < hp->n_layer; il++) {
        const int in_file = ((const uint8_t *) arr.data)[il] != 0;
        const int in_rule = (rm_arch_layer_kind(ld->arch, hp, il) & RM_LAYER_ATTN_LINEAR) != 0;
        if (in_file != in_rule) {
            return rm_fail(RM_E_UNSUPPORTED_ARCH, "%s: %s: '%s' makes layer %d %s, but the forward pass runs only "
                           "the pattern of full_attention_interval = %d (every n-th layer full attention)", ld->fn,
                           ld->path, key, il, in_file ? "linear" : "full attention", hp->full_attn_interval);
        }
    }
    return RM_OK;
}


/* PLE's keys (qwen4exp; llama.cpp's ple.* and embedding_length_per_layer_input), where the file has
 * ple.layers: the layers (ascending, each in range), the n-gram sizes, the eos token, and per PLE
 * layer its hash constants (u64 arrays, layer after layer). A key missing or inconsistent is refused
 * by its name; RM_OK without ple.layers (no PLE layer). */
static rm_status read_ple(const loader * ld, rm_hparams * hp) {
    char key[128];
    snprintf(key, sizeof(key), "%s.ple.layers", ld->arch->name);
    rm_gguf_arr arr;
    rm_status st = rm_gguf_get_arr(ld->g, key, -1, &arr);
    if (st == RM_GGUF_MISSING) {
        return RM_OK;
    }
    if (st != RM_OK || (arr.type != RM_GGUF_INT32 && arr.type != RM_GGUF_UINT32) || arr.n == 0 ||
        arr.n > (uint64_t) hp->n_layer) {
        return rm_fail(RM_E_FORMAT, "%s: %s: '%s' must be an array of 1 to block_count (%d) 32-bit layer ids",
                       ld->fn, ld->path, key, hp->n_layer);
    }
    hp->ple_layers = arr.data;
    hp->n_ple = (int32_t) arr.n;
    for (int32_t i = 0, prev = -1; i < hp->n_ple; i++) {
        int32_t il;
        memcpy(&il, (const char *) arr.data + 4 * (size_t) i, sizeof(il));
        if (il <= prev || il >= hp->n_layer) {
            return rm_fail(RM_E_FORMAT, "%s: %s: '%s' lists layer %d after %d: the ids must ascend, each below "
                           "block_count (%d)", ld->fn, ld->path, key, il, prev, hp->n_layer);
        }
        prev = il;
    }
    static const struct { const char * name; int32_t lo, hi; size_t off; } ints[] = {
        {"ple.ngram_size", 2, RM_PLE_MAX_NGRAM, offsetof(rm_hparams, ple_ngram)},
        {"ple.heads_per_ngram", 1, RM_PLE_MAX_HEADS, offsetof(rm_hparams, ple_heads_per_ngram)},
        {"ple.conv_kernel", 1, RM_PLE_MAX_KERNEL, offsetof(rm_hparams, ple_conv_kernel)},
        {"ple.eos_token_id", 0, INT32_MAX, offsetof(rm_hparams, ple_eos)},
        {"embedding_length_per_layer_input", 1, 1 << 16, offsetof(rm_hparams, n_embd_per_layer)},
    };
    for (size_t i = 0; i < sizeof(ints) / sizeof(ints[0]); i++) {
        int64_t v;
        const int got = get_int(ld, ints[i].name, &v);
        if (got <= 0 || v < ints[i].lo || v > ints[i].hi) {
            return rm_fail(RM_E_FORMAT, "%s: %s: the file has PLE layers (ple.layers), and '%s.%s' is %s: it must be an "
                           "integer in [%d, %d]", ld->fn, ld->path, ld->arch->name, ints[i].name,
                           got == 0 ? "missing" : "not such an integer", ints[i].lo, ints[i].hi);
        }
        const int32_t v32 = (int32_t) v;
        memcpy((char *) hp + ints[i].off, &v32, sizeof(v32));
    }
    hp->n_ple_head = (hp->ple_ngram - 1) * hp->ple_heads_per_ngram;
    if (hp->n_ple_head > RM_PLE_MAX_HEADS) {
        return rm_fail(RM_E_FORMAT, "%s: %s: PLE's (ngram_size - 1) * heads_per_ngram is %d, more than %d", ld->fn,
                       ld->path, hp->n_ple_head, RM_PLE_MAX_HEADS);
    }
    const struct { const char * name; int32_t per_layer; const uint8_t ** out; } arrays[] = {
        {"ple.layer_multipliers", hp->ple_ngram, &hp->ple_mult},
        {"ple.head_offsets", hp->n_ple_head, &hp->ple_head_off},
        {"ple.head_vocab_sizes", hp->n_ple_head, &hp->ple_head_vocab},
    };
    for (size_t i = 0; i < sizeof(arrays) / sizeof(arrays[0]); i++) {
        snprintf(key, sizeof(key), "%s.%s", ld->arch->name, arrays[i].name);
        const uint64_t want = (uint64_t) arrays[i].per_layer * (uint64_t) hp->n_ple;
        st = rm_gguf_get_arr(ld->g, key, -1, &arr);
        if (st != RM_OK || (arr.type != RM_GGUF_UINT64 && arr.type != RM_GGUF_INT64) || arr.n != want) {
            return rm_fail(RM_E_FORMAT, "%s: %s: the file has %d PLE layer(s), and '%s' is %s: it must be an array of "
                           "%llu 64-bit integers (%d per PLE layer)", ld->fn, ld->path, hp->n_ple, key,
                           st == RM_GGUF_MISSING ? "missing" : "not such an array", (unsigned long long) want,
                           arrays[i].per_layer);
        }
        *arrays[i].out = arr.data;
        for (uint64_t j = 0; j < arr.n; j++) {
            uint64_t v;
            memcpy(&v, (const uint8_t *) arr.data + 8 * j, sizeof(v));
            const int bad = i == 0 ? v == 0 || v > (uint64_t) INT64_MAX
                                   : i == 2 ? v == 0 || v > (uint64_t) INT32_MAX : v > (uint64_t) INT32_MAX;
            if (bad) {
                return rm_fail(RM_E_FORMAT, "%s: %s: '%s' entry %llu is %llu: out of range", ld->fn, ld->path, key,
                               (unsigned long long) j, (unsigned long long) v);
            }
        }
    }
    return RM_OK;
}

/* The rows in the table's order, then the checks that tie several values together. */
static rm_status load_hparams(const loader * ld, rm_hparams * hp) {
    for (int32_t i = 0; i < ld->arch->n_hparams; i++) {
        rm_status st = read_hparam(ld, &ld->arch->hparams[i], hp);
        if (st != RM_OK) {
            return st;
        }
    }
    if (!read_layer_swa(ld, hp) || !read_layer_indexer(ld, hp)) {
        return RM_E_FORMAT;
    }
    const rm_status pst = read_ple(ld, hp);
    if (pst != RM_OK) {
        return pst;
    }
    const rm_status ratios = read_layer_ratio(ld, hp);
    if (ratios != RM_OK) {
        return ratios;
    }
    if (hp->n_head % hp->n_head_kv != 0) {
        return rm_fail(RM_E_FORMAT, "%s: %s: head_count %d is not a multiple of head_count_kv %d",
                       ld->fn, ld->path, hp->n_head, hp->n_head_kv);
    }
    if (hp->n_rot % 2 != 0) {
        return rm_fail(RM_E_FORMAT, "%s: %s: rope.dimension_count %d is odd", ld->fn, ld->path, hp->n_rot);
    }
    /* our key: transformers' YaRN `truncate`, which GGUF has no key for; llama.cpp always rounds */
    bool truncate = true;
    const rm_status st = rm_gguf_get_bool(ld->g, "rapidmoe.rope.yarn_truncate", &truncate);
    if (st != RM_OK && st != RM_GGUF_MISSING) {
        return rm_fail(RM_E_FORMAT, "%s: %s: key 'rapidmoe.rope.yarn_truncate' is not a bool", ld->fn, ld->path);
    }
    hp->yarn_truncate = truncate;
    /* our key: the Gated DeltaNet's output gate (transformers' output_gate_type), which GGUF has no
     * key for; a file without it runs silu, transformers' default */
    uint32_t gate = RM_SSM_GATE_SILU;
    const rm_status gst = rm_gguf_get_u32(ld->g, "rapidmoe.ssm.output_gate_func", &gate);
    if ((gst != RM_OK && gst != RM_GGUF_MISSING) || gate > 16) {
        return rm_fail(RM_E_FORMAT, "%s: %s: key 'rapidmoe.ssm.output_gate_func' is not a u32 of at most 16",
                       ld->fn, ld->path);
    }
    if (gate != RM_SSM_GATE_SILU && gate != RM_SSM_GATE_SIGMOID) {
        return rm_fail(RM_E_UNSUPPORTED_ARCH, "%s: %s: key 'rapidmoe.ssm.output_gate_func' is %u: the layers run "
                       "silu (1) or sigmoid (2)", ld->fn, ld->path, gate);
    }
    hp->ssm_gate = (int32_t) gate;
    const rm_status derived = derive_hparams(ld, hp);
    return derived != RM_OK ? derived : linear_hparams(ld, hp);
}

/* Every layer's kind, refused when the forward pass does not run it. */
static rm_status check_layer_kinds(const loader * ld, const rm_hparams * hp) {
    for (int il = 0; il < hp->n_layer; il++) {
        const uint32_t k = rm_arch_layer_kind(ld->arch, hp, il);
        if (k & ~(uint32_t) RM_LAYER_RUNS) {
            char what[160];
            rm_layer_kind_unsupported(k, what, sizeof(what));
            return rm_fail(RM_E_UNSUPPORTED_ARCH, "%s: %s: layer %d has %s, which the forward pass does not run "
                           "yet", ld->fn, ld->path, il, what);
        }
    }
    return RM_OK;
}

/* The arch's per-layer floats (rm_layer_float_row) into every layer: one value for all, an array
 * of at least block_count floats or 32-bit integers (llama.cpp's compress_ratios), or none (0). */
static rm_status read_layer_floats(rm_model * m, const loader * ld) {
    for (int32_t r = 0; r < ld->arch->n_layer_floats; r++) {
        const rm_layer_float_row * row = &ld->arch->layer_floats[r];
        char key[128];
        snprintf(key, sizeof(key), "%s.%s", ld->arch->name, row->key);
        const int64_t ik = rm_gguf_find_kv(ld->g, key);
        if (ik < 0) {
            continue;
        }
        float one = 0.0f;
        rm_gguf_arr arr = {0};
        if (rm_gguf_kv_type(ld->g, ik) == RM_GGUF_ARRAY) {
            if (rm_gguf_get_arr(ld->g, key, -1, &arr) != RM_OK || arr.n < (uint64_t) m->hp.n_layer ||
                (arr.type != RM_GGUF_FLOAT32 && arr.type != RM_GGUF_INT32 && arr.type != RM_GGUF_UINT32)) {
                return rm_fail(RM_E_FORMAT, "%s: %s: '%s' must be a float or an array of at least %d floats or "
                               "32-bit integers", ld->fn, ld->path, key, m->hp.n_layer);
            }
        } else if (rm_gguf_get_f32(ld->g, key, &one) != RM_OK) {
            return rm_fail(RM_E_FORMAT, "%s: %s: '%s' must be a float or an array of floats", ld->fn, ld->path, key);
        }
        for (int il = 0; il < m->hp.n_layer; il++) {
            float v = one;
            if (arr.data) {
                const char * at = (const char *) arr.data + 4 * (size_t) il;
                int32_t i32;
                uint32_t u32;
                if (arr.type == RM_GGUF_FLOAT32) memcpy(&v, at, sizeof(v));
                if (arr.type == RM_GGUF_INT32) memcpy(&i32, at, sizeof(i32)), v = (float) i32;
                if (arr.type == RM_GGUF_UINT32) memcpy(&u32, at, sizeof(u32)), v = (float) u32;
            }
            if (!isfinite(v) || v < 0.0f) {
                return rm_fail(RM_E_FORMAT, "%s: %s: '%s' gives layer %d %g: it must be finite and not negative",
                               ld->fn, ld->path, key, il, (double) v);
            }
            memcpy((char *) &m->layers[il] + row->off, &v, sizeof(v));
        }
    }
    return RM_OK;
}

/* QSA's layers (qwen4exp): blocks of a whole number of positions, 0 for none (dense attention, as
 * llama.cpp reads it); with blocks, an indexer of at least one head as wide as the rotary dims. */
static rm_status check_qsa(const rm_model * m, const char * path) {
    const rm_hparams * hp = &m->hp;
    for (int il = 0; il < hp->n_layer; il++) {
        const rm_layer * L = &m->layers[il];
        if (!(L->kind & RM_LAYER_QSA_INDEX)) {
            continue;
        }
        const float r = L->qsa_ratio;
        if (!(r >= 0.0f) || r != floorf(r) || r > (float) (1 << 24)) {
            return rm_fail(RM_E_FORMAT, "rm_model_load: %s: layer %d is a QSA layer, and attention.compress_ratios "
                           "gives it %g: its key blocks need a whole number of positions (0: none, dense attention)",
                           path, il, (double) r);
        }
        if (r > 0.0f && (hp->index_n_head <= 0 || hp->index_head_dim < hp->n_rot || hp->index_top_k <= 0)) {
            return rm_fail(RM_E_FORMAT, "rm_model_load: %s: layer %d is a QSA layer, and the indexer's keys give "
                           "head_count %d, key_length %d (rope.dimension_count %d) and top_k %d: each must be "
                           "positive, key_length at least the rotary dims", path, il, hp->index_n_head,
                           hp->index_head_dim, hp->n_rot, hp->index_top_k);
        }
    }
    return RM_OK;
}

/* DeepSeek-V4 (RM_ARCH_MHC): the output's stream weights (base and scale F32), each layer's grouped
 * output block made a 3-D tensor of o_groups matrices of o_lora_rank rows (the same bytes: a group's
 * rows are consecutive), its clamped SwiGLUs DeepSeek-V4's, and every hash-routed layer's table of
 * expert ids within [0, n_expert). */
static rm_status load_dsv4(rm_model * m, const char * path) {
    const rm_hparams * hp = &m->hp;
    if (!(m->arch->flags & RM_ARCH_MHC)) {
        return RM_OK;
    }
    const int64_t HW = (int64_t) hp->hc_count * hp->n_embd;
    rm_status st;
    if ((st = bind(m->base, path, "output_hc_fn.weight", 1, HW, hp->hc_count, 1, &m->mhc_head.fn)) != RM_OK ||
        (st = bind(m->base, path, "output_hc_base.weight", 1, hp->hc_count, 1, 1, &m->mhc_head.base)) != RM_OK ||
        (st = bind(m->base, path, "output_hc_scale.weight", 1, 1, 1, 1, &m->mhc_head.scale)) != RM_OK) {
        return st;
    }
    if (m->mhc_head.base.type != RM_TYPE_F32 || m->mhc_head.scale.type != RM_TYPE_F32) {
        return rm_fail(RM_E_UNSUPPORTED_TYPE, "rm_model_load: %s: output_hc_base.weight and output_hc_scale.weight "
                       "must be F32", path);
    }
    if ((int64_t) hp->n_head * hp->head_dim % hp->o_groups != 0) {
        return rm_fail(RM_E_FORMAT, "rm_model_load: %s: attention.output_group_count %d does not divide the %d heads' "
                       "%d floats", path, hp->o_groups, hp->n_head, hp->n_head * hp->head_dim);
    }
    for (int il = 0; il < hp->n_layer; il++) {
        rm_layer * L = &m->layers[il];
        L->wo_a.ne[1] = hp->o_lora_rank;
        L->wo_a.ne[2] = hp->o_groups;
        L->ffn_limit_alpha = RM_SWIGLU_DSV4_ALPHA;   /* silu(min(g, limit)) clamp(u, -limit, limit) */
        const rm_weight * t = &L->hash_experts;
        if (!(L->kind & RM_LAYER_HASH_ROUTE)) {
            continue;
        }
        if (t->type != RM_TYPE_I32) {
            return rm_fail(RM_E_UNSUPPORTED_TYPE, "rm_model_load: %s: blk.%d.ffn_gate_tid2eid.weight must be I32", path, il);
        }
        for (int64_t j = 0; j < t->ne[0] * t->ne[1]; j++) {
            int32_t e;
            memcpy(&e, t->data + 4 * (uint64_t) j, sizeof(e));
            if (e < 0 || e >= hp->n_expert) {
                return rm_fail(RM_E_FORMAT, "rm_model_load: %s: blk.%d.ffn_gate_tid2eid.weight names expert %d for token "
                               "%lld: the layer has %d experts", path, il, (int) e, (long long) (j / t->ne[0]),
                               hp->n_expert);
            }
        }
    }
    return RM_OK;
}

/* PLE (qwen4exp): each listed layer a linear one (its conv's state lives beside the DeltaNet's), its
 * conv taps F32, and the n-gram table (per_layer_token_embd) holding every head's rows. */
static rm_status load_ple(rm_model * m, const char * path) {
    const rm_hparams * hp = &m->hp;
    for (int il = 0; il < hp->n_layer; il++) {
        rm_layer * L = &m->layers[il];
        L->ple_index = rm_hp_ple_index(hp, il);
        if (L->ple_index >= 0 && !(L->kind & RM_LAYER_ATTN_LINEAR)) {
            return rm_fail(RM_E_FORMAT, "rm_model_load: %s: ple.layers lists layer %d, which is not a linear-attention "
                           "layer (PLE runs on those only, as transformers and llama.cpp have it)", path, il);
        }
    }
    if (hp->n_ple == 0) {
        rm_status st = bind(m->base, path, "per_layer_token_embd.weight", 0, 0, 0, 1, &m->ple_embd);
        if (st == RM_OK && m->ple_embd.data) {
            return rm_fail(RM_E_FORMAT, "rm_model_load: %s: tensor 'per_layer_token_embd.weight' is present but the file "
                           "has no ple.layers: its PLE keys are missing", path);
        }
        return st;
    }
    rm_status st = bind(m->base, path, "per_layer_token_embd.weight", 1, hp->n_embd_per_layer, 0, 1, &m->ple_embd);
    if (st != RM_OK) {
        return st;
    }
    if (!rm_type_traits_get(m->ple_embd.type)->to_float) {
        return rm_fail(RM_E_UNSUPPORTED_TYPE, "rm_model_load: %s: tensor 'per_layer_token_embd.weight' has a type "
                       "whose rows cannot be read as floats", path);
    }
    for (int32_t h = 0; h < hp->n_ple * hp->n_ple_head; h++) {
        uint64_t off, vocab;
        memcpy(&off, hp->ple_head_off + 8 * (size_t) h, sizeof(off));
        memcpy(&vocab, hp->ple_head_vocab + 8 * (size_t) h, sizeof(vocab));
        if (off + vocab > (uint64_t) m->ple_embd.ne[1]) {
            return rm_fail(RM_E_FORMAT, "rm_model_load: %s: ple.head_offsets and ple.head_vocab_sizes give PLE head %d "
                           "rows [%llu, %llu), past per_layer_token_embd.weight's %lld rows", path, h,
                           (unsigned long long) off, (unsigned long long) (off + vocab),
                           (long long) m->ple_embd.ne[1]);
        }
    }
    return RM_OK;
}

static rm_weight * layer_field(rm_layer * L, const rm_tensor_row * t) {
    return (rm_weight *) ((char *) L + t->off);
}

/* Binds the tensors the arch's rows give a layer of this kind, in the rows' order. */
static rm_status load_layer(rm_model * m, int il, const char * path, const char * res_path) {
    rm_layer * L = &m->layers[il];
    L->kind = rm_arch_layer_kind(m->arch, &m->hp, il);
    for (int32_t i = 0; i < m->arch->n_tensors; i++) {
        const rm_tensor_row * t = &m->arch->tensors[i];
        if (!rm_layer_kind_has(L->kind, t->when) || (t->residual && !m->residual)) {
            continue;
        }
        char name[96];
        snprintf(name, sizeof(name), t->name, il);
        const int required = t->presence == RM_TENSOR_REQUIRED ||
                             (t->presence == RM_TENSOR_REQUIRED_WHEN && rm_layer_kind_has(L->kind, t->required_when));
        rm_status st = bind(t->residual ? m->residual : m->base, t->residual ? res_path : path, name, required,
                            rm_dim_value(t->ne[0], &m->hp), rm_dim_value(t->ne[1], &m->hp),
                            rm_dim_value(t->ne[2], &m->hp), layer_field(L, t));
        if (st != RM_OK) {
            return st;
        }
    }
    return RM_OK;
}

int64_t rm_model_widest_row(const rm_model * m) {
    int64_t widest = m->output.ne[0];
    const rm_weight * head[] = {&m->hc_head.down, &m->hc_head.up, &m->mhc_head.fn};
    for (size_t i = 0; i < sizeof(head) / sizeof(head[0]); i++) {
        widest = head[i]->data && head[i]->ne[0] > widest ? head[i]->ne[0] : widest;
    }
    for (int il = 0; il < m->hp.n_layer; il++) {
        for (int32_t i = 0; i < m->arch->n_tensors; i++) {
            const rm_weight * w = layer_field(&m->layers[il], &m->arch->tensors[i]);
            widest = rm_layer_kind_has(m->layers[il].kind, m->arch->tensors[i].when) && w->data && w->ne[0] > widest
                         ? w->ne[0] : widest;
        }
    }
    return widest;
}

/* The optional rows of one group (rm_tensor_group) come together in each layer: the forward pass
 * uses them together, and one alone (a renamed or dropped tensor) would be read where it is not. */
static rm_status check_groups(const rm_model * m, int il, const char * path) {
    const rm_layer * L = &m->layers[il];
    for (int g = RM_GROUP_NONE + 1; g < RM_GROUP_COUNT; g++) {
        const rm_tensor_row * present = NULL, * absent = NULL;
        for (int32_t i = 0; i < m->arch->n_tensors; i++) {
            const rm_tensor_row * t = &m->arch->tensors[i];
            if (t->group == g && rm_layer_kind_has(L->kind, t->when)) {
                const rm_weight * w = (const rm_weight *) ((const char *) L + t->off);
                *(w->data ? &present : &absent) = t;
            }
        }
        if (present && absent) {
            char has[96], lacks[96];
            snprintf(has, sizeof(has), present->name, il);
            snprintf(lacks, sizeof(lacks), absent->name, il);
            return rm_fail(RM_E_FORMAT, "rm_model_load: %s: tensor '%s' is present but '%s' is missing: the layer "
                           "needs them together or not at all", path, has, lacks);
        }
    }
    return RM_OK;
}

/* Norms, biases, gates and convolution taps are read as floats by the forward pass (the rows
 * marked f32). Checked once every layer is bound, so a shape error anywhere comes first. */
static rm_status check_float_types(rm_model * m, const char * path) {
    /* the tensors the forward pass reads as floats (norms, biases, gates, convolutions) that the file
     * holds in another type (llama.cpp's quantizer takes any 2-D tensor of enough elements:
     * DeepSeek-V4's compressor gate biases): made F32 copies, in one block the model owns */
    uint64_t floats = 0;
    for (int pass = 0; pass < 2; pass++) {
        float * at = m->float_copies;
        for (int il = 0; il < m->hp.n_layer; il++) {
            rm_layer * L = &m->layers[il];
            for (int32_t i = 0; i < m->arch->n_tensors; i++) {
                const rm_tensor_row * t = &m->arch->tensors[i];
                rm_weight * w = layer_field(L, t);
                if (!t->f32 || !rm_layer_kind_has(L->kind, t->when) || !w->data || w->type == RM_TYPE_F32) {
                    continue;
                }
                const rm_type_traits * tt = rm_type_traits_get(w->type);
                const int64_t rows = w->ne[1] * w->ne[2] * w->ne[3];
                if (!tt || !tt->to_float) {
                    char name[96];
                    snprintf(name, sizeof(name), t->name, il);
                    return rm_fail(RM_E_UNSUPPORTED_TYPE, "rm_model_load: %s: tensor '%s' is of ggml type %d, which "
                                   "cannot be read as the floats the forward pass takes", path, name, w->type);
                }
                if (pass == 0) {
                    floats += (uint64_t) (w->ne[0] * rows);
                    continue;
                }
                for (int64_t r = 0; r < rows; r++) {
                    tt->to_float(w->data + (uint64_t) r * w->row_bytes, at + r * w->ne[0], w->ne[0]);
                }
                w->type = RM_TYPE_F32;
                w->data = (const uint8_t *) at;
                w->row_bytes = sizeof(float) * (uint64_t) w->ne[0];
                at += w->ne[0] * rows;
            }
        }
        if (pass == 0 && floats > 0 && !(m->float_copies = malloc(sizeof(float) * floats))) {
            return rm_fail(RM_E_OOM, "rm_model_load: %s: out of memory for %llu floats", path, (unsigned long long) floats);
        }
        if (floats == 0) {
            break;
        }
    }
    if (m->output_norm.data && m->output_norm.type != RM_TYPE_F32) {
        return rm_fail(RM_E_UNSUPPORTED_TYPE, "rm_model_load: %s: output_norm.weight must be F32", path);
    }
    return RM_OK;
}

/* A layer's experts hold their gate and up rows apart (gate_exps, up_exps) or together (llama.cpp's
 * ffn_gate_up_exps). The fused form runs on the CPU without a residual sidecar; RESplit files keep
 * them apart (rapidmoe convert splits a fused file). */
static rm_status check_expert_pairs(const rm_model * m, const char * path, const rm_model_params * params) {
    for (int il = 0; il < m->hp.n_layer; il++) {
        const rm_layer * L = &m->layers[il];
        if (!(L->kind & RM_LAYER_FFN_MOE)) {
            continue;
        }
        const int fused = L->gate_up_exps.data != NULL, apart = L->gate_exps.data && L->up_exps.data;
        if (fused == apart) {
            return rm_fail(RM_E_FORMAT, "rm_model_load: %s: layer %d needs either blk.%d.ffn_gate_up_exps.weight or both "
                           "blk.%d.ffn_gate_exps.weight and blk.%d.ffn_up_exps.weight", path, il, il, il, il);
        }
        if (fused && (m->residual || params->use_gpu)) {
            return rm_fail(RM_E_UNSUPPORTED_ARCH, "rm_model_load: %s: layer %d's experts hold gate and up in one tensor "
                           "(llama.cpp's ffn_gate_up_exps), which runs on the CPU without a residual; `rapidmoe convert` "
                           "writes them apart for a residual or a GPU", path, il);
        }
    }
    return RM_OK;
}

static uint64_t weight_bytes(const rm_weight * w) {
    return w->data ? w->row_bytes * (uint64_t) w->ne[1] * (uint64_t) w->ne[2] : 0;
}

/* The hyperparameters rm_model_info shows. */
static void info_hparams(rm_model_info * in, const rm_arch * arch, const rm_hparams * hp) {
    snprintf(in->arch, sizeof(in->arch), "%s", arch->name);
    in->n_vocab = hp->n_vocab;
    in->n_embd = hp->n_embd;
    in->n_layer = hp->n_layer;
    in->n_head = hp->n_head;
    in->n_head_kv = hp->n_head_kv;
    in->head_dim = hp->head_dim;
    in->n_expert = hp->n_expert;
    in->n_expert_used = hp->n_expert_used;
    in->n_ff_exp = hp->n_ff_exp;
    in->n_ff_shexp = hp->n_ff_shexp;
    in->n_ctx_train = hp->n_ctx_train;
    in->norm_topk = hp->norm_topk;
    in->n_ff = hp->n_ff;
    in->n_layer_dense_lead = hp->n_layer_dense_lead;
    in->n_rot = hp->n_rot;
    in->head_dim_v = hp->head_dim_v;
    in->q_lora_rank = hp->q_lora_rank;
    in->kv_lora_rank = hp->kv_lora_rank;
    const rm_size_params sp = rm_size_params_of(hp, 1, 1, 0);   /* the sizes' own reading of the linear layers */
    in->n_layer_linear = sp.n_layer_linear;
    in->ssm_d_conv = sp.ssm_d_conv;
    in->ssm_conv_dim = sp.ssm_conv_dim;
    in->ssm_n_v = sp.ssm_n_v;
    in->ssm_d_state = sp.ssm_d_state;
    in->ssm_head_v = sp.ssm_head_v;
    in->n_swa = hp->n_swa;
    in->n_layer_swa = sp.n_layer_swa;
    in->n_head_kv_swa = hp->n_head_kv_swa;
    in->head_dim_swa = hp->head_dim_swa;
    in->n_head_swa = hp->n_head_swa;
    in->index_head_dim = hp->index_head_dim;
    in->index_n_head = hp->index_n_head;
    in->hc_count = hp->hc_count;
    in->hc_low_rank = hp->hc_low_rank;
    in->index_top_k = hp->index_top_k;
    in->n_layer_ple = sp.n_layer_ple;
    in->ple_ngram = sp.ple_ngram;
    in->ple_conv_kernel = sp.ple_conv_kernel;
    in->ple_embd = sp.ple_embd;
    in->n_layer_csa = sp.n_layer_csa;
    in->n_layer_hca = sp.n_layer_hca;
}

static void fill_info(rm_model * m) {
    rm_model_info * in = &m->info;
    const rm_hparams * hp = &m->hp;
    info_hparams(in, m->arch, hp);
    in->has_residual = m->residual != NULL;
    in->n_threads = rm_pool_size(m->pool);
    for (int il = 0; il < hp->n_layer; il++) {
        rm_layer * L = &m->layers[il];
        for (int32_t i = 0; i < m->arch->n_tensors; i++) {
            const rm_tensor_row * t = &m->arch->tensors[i];
            if (!rm_layer_kind_has(L->kind, t->when)) {
                continue;   /* two rows may fill one field for different kinds: count it once */
            }
            const uint64_t b = weight_bytes(layer_field(L, t));
            if (t->residual) {
                in->residual_expert_bytes += b;
            } else if (t->expert) {
                in->base_expert_bytes += b;
            } else {
                in->dense_bytes += b;
            }
        }
    }
    in->dense_bytes += weight_bytes(&m->output_norm) + weight_bytes(&m->output) + weight_bytes(&m->hc_head.norm) +
                       weight_bytes(&m->hc_head.down) + weight_bytes(&m->hc_head.up);
}

/* ---- the sidecar belongs to this base ------------------------------------------------------ */

#define FP_WINDOW 1024u   /* bytes hashed at each end of a base expert tensor (resplit.py) */

static uint64_t fnv1a(uint64_t h, const uint8_t * p, uint64_t n) {
    for (uint64_t i = 0; i < n; i++) {
        h = (h ^ p[i]) * 0x100000001B3ull;
    }
    return h;
}

static uint64_t fnv1a_u64(uint64_t h, uint64_t v, int n_bytes) {
    uint8_t b[8];
    for (int i = 0; i < n_bytes; i++) {
        b[i] = (uint8_t) (v >> (8 * i));   /* little-endian, as the file */
    }
    return fnv1a(h, b, (uint64_t) n_bytes);
}

/* resplit.fingerprint: FNV-1a over type (u32), ne[4] and nbytes (u64), the first and last bytes. */
static uint64_t tensor_fingerprint(const rm_tensor_info * ti) {
    const uint64_t w = ti->nbytes < FP_WINDOW ? ti->nbytes : FP_WINDOW;
    uint64_t h = fnv1a_u64(0xCBF29CE484222325ull, (uint32_t) ti->type, 4);
    for (int d = 0; d < 4; d++) {
        h = fnv1a_u64(h, (uint64_t) ti->ne[d], 8);
    }
    h = fnv1a_u64(h, ti->nbytes, 8);
    if (w == 0) {
        return h;
    }
    h = fnv1a(h, (const uint8_t *) ti->data, w);
    return fnv1a(h, (const uint8_t *) ti->data + (ti->nbytes - w), w);
}

/* The sidecar's rapidmoe.base.uuid must be the base's rapidmoe.uuid, and, when the sidecar has
 * rapidmoe.base.expert_fingerprints (one per sidecar tensor), each base expert tensor's data must
 * still hash to it. Sidecars written before the fingerprints existed are bound by the uuid only;
 * a sidecar with neither key (not written by the converter) is not checked. */
static rm_status check_sidecar(const rm_model * m, const char * path, const char * res_path) {
    const int64_t iu = rm_gguf_find_kv(m->residual, "rapidmoe.base.uuid");
    if (iu >= 0) {
        const int64_t bu = rm_gguf_find_kv(m->base, "rapidmoe.uuid");
        rm_str want = rm_gguf_kv_type(m->residual, iu) == RM_GGUF_STRING ? rm_gguf_kv_str(m->residual, iu) : (rm_str) {0};
        rm_str have = bu >= 0 && rm_gguf_kv_type(m->base, bu) == RM_GGUF_STRING ? rm_gguf_kv_str(m->base, bu) : (rm_str) {0};
        if (!want.ptr || !have.ptr || want.len != have.len || memcmp(want.ptr, have.ptr, want.len) != 0) {
            return rm_fail(RM_E_FORMAT, "rm_model_load: %s was made for base uuid '%.*s', but %s has uuid '%.*s'; "
                           "reconvert, or pass the matching pair", res_path, (int) (want.len > 64 ? 64 : want.len),
                           want.ptr ? want.ptr : "", path, (int) (have.len > 64 ? 64 : have.len), have.ptr ? have.ptr : "");
        }
    }
    const int64_t ifp = rm_gguf_find_kv(m->residual, "rapidmoe.base.expert_fingerprints");
    if (ifp < 0) {
        return RM_OK;
    }
    const int64_t n = rm_gguf_n_tensors(m->residual);
    if (rm_gguf_kv_arr_type(m->residual, ifp) != RM_GGUF_UINT64 || rm_gguf_kv_arr_n(m->residual, ifp) != (uint64_t) n) {
        return rm_fail(RM_E_FORMAT, "rm_model_load: %s: rapidmoe.base.expert_fingerprints must be %lld uint64 "
                       "values (one per tensor)", res_path, (long long) n);
    }
    const uint8_t * fps = (const uint8_t *) rm_gguf_kv_data(m->residual, ifp);
    for (int64_t i = 0; i < n; i++) {
        rm_tensor_info rt, bt;
        rm_status st = rm_gguf_tensor_info(m->residual, i, &rt);
        if (st != RM_OK) {
            return st;
        }
        char name[96];
        const int len = (int) rt.name.len - (int) strlen(".residual");
        if (len <= 0 || len + 8 >= (int) sizeof(name) || memcmp(rt.name.ptr + len, ".residual", 9) != 0) {
            return rm_fail(RM_E_FORMAT, "rm_model_load: %s: tensor '%.*s' is not a residual tensor", res_path,
                           (int) (rt.name.len > 80 ? 80 : rt.name.len), rt.name.ptr);
        }
        snprintf(name, sizeof(name), "%.*s.weight", len, rt.name.ptr);
        const int64_t ib = rm_gguf_find_tensor(m->base, name);
        if (ib < 0) {
            return rm_fail(RM_E_FORMAT, "rm_model_load: %s: base tensor '%s' of residual '%.*s' is missing", path,
                           name, (int) rt.name.len, rt.name.ptr);
        }
        if ((st = rm_gguf_tensor_info(m->base, ib, &bt)) != RM_OK) {
            return st;
        }
        uint64_t want = 0;
        for (int k = 7; k >= 0; k--) {
            want = want << 8 | fps[8 * i + k];
        }
        const uint64_t have = tensor_fingerprint(&bt);
        if (have != want) {
            return rm_fail(RM_E_FORMAT, "rm_model_load: %s: base tensor '%s' is not the data %s was made for "
                           "(fingerprint %016llx, expected %016llx); the base was changed after conversion: "
                           "reconvert, or pass the matching pair", path, name, res_path,
                           (unsigned long long) have, (unsigned long long) want);
        }
    }
    return RM_OK;
}

/* The device part of the params: open the device and place the weights, or say why the CPU runs. */
static rm_status open_device(rm_model * m, const rm_model_params * params) {
    rm_gpu_info * gi = &m->gpu_info;
    gi->struct_size = sizeof(rm_gpu_info);
    gi->requested = params->use_gpu != 0;
    gi->device = params->gpu_device;
    gi->budget_bytes = params->gpu_memory_bytes;
    gi->n_experts_total = m->hp.n_layer * m->hp.n_expert;
    if (params->use_gpu) {
        if (params->gpu_device < 0) {
            return rm_fail(RM_E_INVALID_ARG, "rm_model_load: gpu_device %d is negative", params->gpu_device);
        }
        if (params->residual_upload_min_tokens < 0) {
            return rm_fail(RM_E_INVALID_ARG, "rm_model_load: residual_upload_min_tokens %d is negative",
                           params->residual_upload_min_tokens);
        }
    }
    return rm_device_open(m, params, &m->device, &m->device_state, gi);
}

static uint64_t file_bytes(const char * path) {
    struct stat sb;
    return path && stat(path, &sb) == 0 ? (uint64_t) sb.st_size : 0;
}

/* RM_LOAD_AUTO streams a CPU model whose files do not fit in the memory the process may take: a
 * mapping would have the kernel drop and read again pages of every layer for every token. (Files
 * that fit are mapped when they take more than three quarters of it: the page cache then holds
 * them whole.) */
static int stream_pays(const char * path, const rm_model_params * params) {
    const uint64_t room = rm_memory_room();
    return room != UINT64_MAX && file_bytes(path) + file_bytes(params->residual_path) > room;
}

/* The routed experts' tensors of m, whole (all experts of each): the ranges the cache reads. */
static int64_t expert_ranges(const rm_model * m, int residual, rm_byte_range * out) {
    int64_t n = 0;
    for (int il = 0; il < m->hp.n_layer; il++) {
        const rm_layer * L = &m->layers[il];
        const rm_weight * ws[4] = {&L->gate_exps, &L->up_exps, &L->down_exps, &L->gate_up_exps};
        const rm_weight * rs[4] = {&L->gate_res, &L->up_res, &L->down_res, NULL};
        for (int k = 0; k < 4; k++) {
            const rm_weight * w = residual ? rs[k] : ws[k];
            if (w && w->data) {
                out[n++] = (rm_byte_range) {w->data, (uint64_t) w->ne[1] * (uint64_t) w->ne[2] * w->row_bytes};
            }
        }
    }
    return n;
}

/* RM_LOAD_STREAM: all but the routed experts made resident, and the experts' cache in the rest of
 * the budget. */
static rm_status open_stream(rm_model * m, const char * path, const rm_model_params * params) {
    if (params->use_gpu) {
        return rm_fail(RM_E_INVALID_ARG, "rm_model_load: streaming the experts from the files (RM_LOAD_STREAM) runs on "
                       "the CPU only; load with a GPU placement or a stream, not both");
    }
    if (m->hp.n_expert <= 0) {
        return rm_fail(RM_E_INVALID_ARG, "rm_model_load: %s: the model has no routed experts to stream", path);
    }
    rm_byte_range * r = malloc(sizeof(rm_byte_range) * ((size_t) m->hp.n_layer * 4 + 1));
    if (!r) {
        return rm_fail(RM_E_OOM, "rm_model_load: out of memory");
    }
    /* the budget checked before anything changes: a refused stream leaves a plain mapping */
    uint64_t experts = 0, unit = 0;
    for (int f = 0; f < 2; f++) {
        rm_gguf * g = f ? m->residual : m->base;
        if (!g) {
            continue;
        }
        const int64_t n = expert_ranges(m, f, r);
        for (int64_t j = 0; j < n; j++) experts += r[j].bytes;
        m->resident_bytes += rm_gguf_size(g);
    }
    m->resident_bytes -= experts;
    for (int64_t k = 0, n = expert_ranges(m, 0, r); k < n && k < 4; k++) {   /* one expert of layer 0 */
        unit += r[k].bytes / (uint64_t) m->hp.n_expert;
    }
    m->ram_budget = params->ram_budget_bytes ? params->ram_budget_bytes : rm_memory_room() / 4 * 3;
    const int32_t min_slots = m->hp.n_expert_used * (m->residual ? 2 : 1);
    if (m->ram_budget <= m->resident_bytes + (uint64_t) min_slots * unit) {
        free(r);
        return rm_fail(RM_E_INVALID_ARG, "rm_model_load: %s: a RAM budget of %llu bytes is below the %llu bytes of "
                       "weights that stay in memory (all but the routed experts) and the %llu of one token's experts",
                       path, (unsigned long long) m->ram_budget, (unsigned long long) m->resident_bytes,
                       (unsigned long long) (min_slots * unit));
    }
    rm_status st = RM_OK;
    for (int f = 0; f < 2 && st == RM_OK; f++) {
        rm_gguf * g = f ? m->residual : m->base;
        if (g) {
            st = rm_gguf_keep_resident(g, f ? params->residual_path : path, r, expert_ranges(m, f, r));
        }
    }
    free(r);
    if (st != RM_OK) {
        return st;
    }
    return rm_xcache_open(m, path, params->residual_path, m->ram_budget - m->resident_bytes, min_slots,
                          params->prefetch, &m->xcache);
}

static rm_status load(rm_model * m, const char * path, const rm_model_params * params) {
    if (params->load < RM_LOAD_AUTO || params->load > RM_LOAD_STREAM) {
        return rm_fail(RM_E_INVALID_ARG, "rm_model_load: params.load %d is not RM_LOAD_AUTO, RM_LOAD_MMAP, RM_LOAD_READ "
                       "or RM_LOAD_STREAM", params->load);
    }
    if (params->prefetch < RM_PREFETCH_NONE || params->prefetch > RM_PREFETCH_PREDICT) {
        return rm_fail(RM_E_INVALID_ARG, "rm_model_load: params.prefetch %d is not RM_PREFETCH_NONE, _KNOWN or _PREDICT",
                       params->prefetch);
    }
    /* a GPU placement copies its experts to the device: the host keeps them only as a mapping */
    const int stream = params->load == RM_LOAD_STREAM ||
                       (params->load == RM_LOAD_AUTO && !params->use_gpu && stream_pays(path, params));
    const int32_t load_mode = stream || (params->load == RM_LOAD_AUTO && params->use_gpu) ? RM_LOAD_MMAP : params->load;
    rm_status st = rm_gguf_open_load(path, load_mode, &m->base);
    if (st != RM_OK) {
        return st;
    }
    loader ld = {"rm_model_load", path, m->base, NULL};
    if ((st = find_arch(&ld)) != RM_OK) {
        return st;
    }
    m->arch = ld.arch;
    if ((st = load_hparams(&ld, &m->hp)) != RM_OK || (st = check_layer_kinds(&ld, &m->hp)) != RM_OK) {
        return st;
    }
    if (params->residual_path) {
        if ((st = rm_gguf_open_load(params->residual_path, load_mode, &m->residual)) != RM_OK ||
            (st = check_sidecar(m, path, params->residual_path)) != RM_OK) {
            return st;
        }
    }
    /* The tensors outside the layers are the same for every architecture; n_vocab is the
     * embedding table's height. */
    if ((st = bind(m->base, path, "token_embd.weight", 1, m->hp.n_embd, 0, 1, &m->tok_embd)) != RM_OK) {
        return st;
    }
    m->hp.n_vocab = (int32_t) m->tok_embd.ne[1];
    const int hyper = (m->arch->flags & RM_ARCH_HYPER) != 0;   /* its mixer in place of output_norm */
    const int64_t HW = (int64_t) m->hp.hc_count * m->hp.n_embd;
    if (hyper && ((st = bind(m->base, path, "output_hc_norm.weight", 1, HW, 1, 1,
                             &m->hc_head.norm)) != RM_OK ||
                  (st = bind(m->base, path, "output_hc_down.weight", 1, HW, m->hp.hc_low_rank, 1,
                             &m->hc_head.down)) != RM_OK ||
                  (st = bind(m->base, path, "output_hc_up.weight", 1, m->hp.hc_low_rank, HW, 1,
                             &m->hc_head.up)) != RM_OK)) {
        return st;
    }
    if (hyper && m->hc_head.norm.type != RM_TYPE_F32) {
        return rm_fail(RM_E_UNSUPPORTED_TYPE, "rm_model_load: %s: output_hc_norm.weight must be F32", path);
    }
    if ((st = bind(m->base, path, "output_norm.weight", !hyper, m->hp.n_embd, 1, 1, &m->output_norm)) != RM_OK ||
        (st = bind(m->base, path, "output.weight", 0, m->hp.n_embd, m->hp.n_vocab, 1, &m->output)) != RM_OK) {
        return st;
    }
    if (!m->output.data) {
        m->output = m->tok_embd;   /* tied embeddings */
    }
    m->layers = calloc((size_t) m->hp.n_layer, sizeof(rm_layer));
    if (!m->layers) {
        return rm_fail(RM_E_OOM, "rm_model_load: out of memory");
    }
    for (int il = 0; il < m->hp.n_layer; il++) {
        if ((st = load_layer(m, il, path, params->residual_path)) != RM_OK || (st = check_groups(m, il, path)) != RM_OK) {
            return st;
        }
    }
    if ((st = check_float_types(m, path)) != RM_OK || (st = check_expert_pairs(m, path, params)) != RM_OK ||
        (st = read_layer_floats(m, &ld)) != RM_OK) {
        return st;
    }
    if ((st = check_qsa(m, path)) != RM_OK || (st = load_ple(m, path)) != RM_OK || (st = load_dsv4(m, path)) != RM_OK) {
        return st;
    }
    /* step35's frequencies cover the sliding layers' rotary dims; its full layers read the first half */
    const int32_t n_freqs = (m->arch->flags & RM_ARCH_FULL_ROT_HALF) ? m->hp.n_rot_swa / 2 : m->hp.n_rot / 2;
    if ((st = bind(m->base, path, "rope_freqs.weight", 0, n_freqs, 1, 1, &m->rope_freqs)) != RM_OK) {
        return st;
    }
    if (m->rope_freqs.data && m->rope_freqs.type != RM_TYPE_F32) {
        return rm_fail(RM_E_UNSUPPORTED_TYPE, "rm_model_load: %s: rope_freqs.weight must be F32", path);
    }
    if (stream && (st = open_stream(m, path, params)) != RM_OK) {
        if (params->load == RM_LOAD_STREAM || st != RM_E_INVALID_ARG) {
            return st;
        }
        rm_clear_error();   /* RM_LOAD_AUTO's stream does not fit either (or has no experts): the mapping it is */
    }
    m->pool = rm_pool_new(params->n_threads);
    if (!m->pool) {
        return rm_fail(RM_E_OOM, "rm_model_load: cannot start %d worker threads", params->n_threads);
    }
    pthread_mutex_init(&m->lock, NULL);
    fill_info(m);
    return open_device(m, params);
}

rm_status rm_model_load(const char * path, const rm_model_params * params, rm_model ** out) {
    rm_clear_error();
    if (!path || !out) {
        return rm_fail(RM_E_INVALID_ARG, "rm_model_load: path and out must not be NULL");
    }
    *out = NULL;
    rm_model_params p = {0};
    p.struct_size = sizeof(rm_model_params);
    if (params) {
        /* ABI 1 callers pass the size before the GPU fields, ABI 6 callers the size before `load`:
         * the fields they do not know keep their zero defaults */
        const size_t v1 = offsetof(rm_model_params, use_gpu), v6 = offsetof(rm_model_params, load);
        const size_t v9 = offsetof(rm_model_params, ram_budget_bytes);   /* `load`, then padding */
        if (params->struct_size != sizeof(rm_model_params) && params->struct_size != v1 && params->struct_size != v6 &&
            params->struct_size != v9) {
            return rm_fail(RM_E_INVALID_ARG, "rm_model_load: params.struct_size %u is none of %zu, %zu, %zu and %zu "
                           "(mismatched header)", params->struct_size, sizeof(rm_model_params), v9, v6, v1);
        }
        /* an ABI 9 caller's padding after `load` is not a field of its own */
        memcpy(&p, params, params->struct_size == v9 ? offsetof(rm_model_params, prefetch) : params->struct_size);
    }
    params = &p;
    rm_model * m = calloc(1, sizeof(*m));
    if (!m) {
        return rm_fail(RM_E_OOM, "rm_model_load: out of memory");
    }
    rm_status st = load(m, path, params);
    if (st != RM_OK) {
        rm_model_free(m);
        return st;
    }
    *out = m;
    rm_clear_error();   /* optional keys that were absent left their messages behind */
    return RM_OK;
}

void rm_model_free(rm_model * m) {
    if (!m) {
        return;
    }
    if (m->pool) {
        rm_pool_free(m->pool);
        pthread_mutex_destroy(&m->lock);
    }
    if (m->device) {
        m->device->close(m->device_state);
    }
    rm_xcache_free(m->xcache);
    free(m->layers);
    free(m->float_copies);
    rm_gguf_close(m->residual);
    rm_gguf_close(m->base);
    free(m);
}

rm_status rm_model_expert_cache_stats(const rm_model * m, rm_expert_cache_stats * out) {
    rm_clear_error();
    if (!m || !out) {
        return rm_fail(RM_E_INVALID_ARG, "rm_model_expert_cache_stats: NULL argument");
    }
    if (out->struct_size != sizeof(*out)) {
        return rm_fail(RM_E_INVALID_ARG, "rm_model_expert_cache_stats: struct_size %u, expected %zu", out->struct_size,
                       sizeof(*out));
    }
    memset(out, 0, sizeof(*out));
    out->struct_size = sizeof(*out);
    if (m->xcache) {
        rm_xcache_stats(m->xcache, out);
        out->budget_bytes = m->ram_budget;
        out->resident_bytes = m->resident_bytes;
    }
    return RM_OK;
}

/* The planner's way to a file's hyperparameters: the loader's own reading, without the tensors. */
rm_status rm_arch_read_hparams(const rm_gguf * g, const char * path, rm_model_info * out) {
    rm_clear_error();
    if (!g || !out) {
        return rm_fail(RM_E_INVALID_ARG, "rm_arch_read_hparams: g and out must not be NULL");
    }
    memset(out, 0, sizeof(*out));
    loader ld = {"rm_arch_read_hparams", path ? path : "", g, NULL};
    rm_hparams hp = {0};
    rm_status st;
    if ((st = find_arch(&ld)) != RM_OK || (st = load_hparams(&ld, &hp)) != RM_OK ||
        (st = check_layer_kinds(&ld, &hp)) != RM_OK) {
        return st;
    }
    info_hparams(out, ld.arch, &hp);
    rm_clear_error();   /* optional keys that were absent left their messages behind */
    return RM_OK;
}

rm_status rm_model_info_get(const rm_model * m, rm_model_info * out) {
    rm_clear_error();
    if (!m || !out) {
        return rm_fail(RM_E_INVALID_ARG, "rm_model_info_get: NULL argument");
    }
    *out = m->info;
    return RM_OK;
}

rm_status rm_model_gpu_info(const rm_model * m, rm_gpu_info * out) {
    rm_clear_error();
    if (!m || !out) {
        return rm_fail(RM_E_INVALID_ARG, "rm_model_gpu_info: NULL argument");
    }
    if (out->struct_size != sizeof(rm_gpu_info)) {
        return rm_fail(RM_E_INVALID_ARG, "rm_model_gpu_info: struct_size %u != %zu (mismatched header)",
                       out->struct_size, sizeof(rm_gpu_info));
    }
    *out = m->gpu_info;
    if (m->device && m->device->describe) {
        m->device->describe(m->device_state, out);
    }
    return RM_OK;
}
