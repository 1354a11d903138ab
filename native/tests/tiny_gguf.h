/* tiny_gguf.h - small random MoE models written as GGUF files, for the C tests of the backends.
 *
 * A test that must run where Python is absent (a GPU machine) still needs a model: this writes a
 * base file and, optionally, its residual sidecar, in the layout the loader reads (model.c), with
 * random weights (never zeros) quantized by the library's own reference quantizers. The
 * residual is the sidecar's definition: R = quantize(W - dequant(B)).
 *
 *   tiny_spec s = tiny_default("qwen3moe");
 *   s.expert_type = RM_TYPE_Q3_K;
 *   tiny_write(&s, "/tmp/m.gguf", "/tmp/m.residual.gguf");
 */
#ifndef RM_TINY_GGUF_H
#define RM_TINY_GGUF_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rapidmoe.h"

typedef struct tiny_spec {
    const char * arch;            /* "llama", "qwen2moe" (shared expert, q/k/v biases), "qwen3moe" (q/k norms) */
    int32_t n_embd, n_layer, n_head, n_head_kv, head_dim, n_expert, n_expert_used, n_ff, n_ff_shexp, n_vocab, n_ctx;
    int32_t dense_type;           /* attention matrices and the shared expert */
    int32_t expert_type;          /* expert bases */
    int32_t residual_type;        /* expert residuals; < 0: no sidecar */
    int32_t output_type;
    float   weight_std, head_std;
    uint64_t seed;
} tiny_spec;

static inline tiny_spec tiny_default(const char * arch) {
    tiny_spec s = {arch, 256, 2, 4, 2, 64, 8, 2, 256, 256, 320, 256,
                   RM_TYPE_Q8_0, RM_TYPE_Q4_K, RM_TYPE_Q8_0, RM_TYPE_Q8_0, 0.05f, 0.1f, 1};
    return s;
}

/* ---- a growing byte buffer ---------------------------------------------------------------- */

typedef struct tiny_buf {
    uint8_t * p;
    size_t    n, cap;
} tiny_buf;

static void tiny_put(tiny_buf * b, const void * src, size_t n) {
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->n + n) cap *= 2;
        b->p = (uint8_t *) realloc(b->p, cap);
        b->cap = cap;
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}

static void tiny_u32(tiny_buf * b, uint32_t v) { tiny_put(b, &v, 4); }
static void tiny_u64(tiny_buf * b, uint64_t v) { tiny_put(b, &v, 8); }
static void tiny_str(tiny_buf * b, const char * s) { tiny_u64(b, strlen(s)); tiny_put(b, s, strlen(s)); }

static void tiny_kv_u32(tiny_buf * b, const char * arch, const char * key, uint32_t v) {
    char k[128];
    snprintf(k, sizeof(k), "%s.%s", arch, key);
    tiny_str(b, k);
    tiny_u32(b, RM_GGUF_UINT32);
    tiny_u32(b, v);
}

static void tiny_kv_f32(tiny_buf * b, const char * arch, const char * key, float v) {
    char k[128];
    snprintf(k, sizeof(k), "%s.%s", arch, key);
    tiny_str(b, k);
    tiny_u32(b, RM_GGUF_FLOAT32);
    tiny_put(b, &v, 4);
}

/* ---- random numbers: the same on every machine --------------------------------------------- */

static double tiny_uniform(uint64_t * s) {
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return (double) ((*s * 0x2545F4914F6CDD1Dull) >> 11) * 0x1p-53;
}

static float tiny_gauss(uint64_t * s) {
    const double u = tiny_uniform(s) + 0x1p-60, v = tiny_uniform(s);
    return (float) (sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
}

/* ---- tensors ------------------------------------------------------------------------------- */

typedef struct tiny_tensor {
    char      name[96];
    int32_t   n_dims;
    int64_t   ne[3];
    int32_t   type;
    uint8_t * data;
    uint64_t  nbytes;
} tiny_tensor;

typedef struct tiny_file {
    tiny_tensor t[256];
    int         n;
} tiny_file;

/* Adds a tensor of n = ne0*ne1*ne2 values drawn as offset + std * N(0, 1), quantized to type;
 * with res (and res_type >= 0) the residual tensor of the same name's ".residual" goes there. */
static int tiny_add(tiny_file * f, tiny_file * res, int32_t res_type, uint64_t * rng, const char * name, int32_t type,
                    int n_dims, int64_t ne0, int64_t ne1, int64_t ne2, float offset, float std) {
    if (f->n >= 256 || (res && res->n >= 256)) return -1;
    const int64_t n = ne0 * ne1 * ne2;
    float * x = (float *) malloc(sizeof(float) * (size_t) n);
    for (int64_t i = 0; i < n; i++) x[i] = offset + std * tiny_gauss(rng);
    tiny_tensor * t = &f->t[f->n++];
    snprintf(t->name, sizeof(t->name), "%s.weight", name);
    t->n_dims = n_dims;
    t->ne[0] = ne0, t->ne[1] = ne1, t->ne[2] = ne2;
    t->type = type;
    t->nbytes = rm_row_bytes(type, ne0) * (uint64_t) (ne1 * ne2);
    t->data = (uint8_t *) malloc(t->nbytes);
    if (!t->nbytes || rm_quantize(type, x, ne1 * ne2, ne0, t->data, t->nbytes, 0) != RM_OK) {
        free(x);
        return -1;
    }
    if (res && res_type >= 0) {
        float * back = (float *) malloc(sizeof(float) * (size_t) n);
        rm_dequantize(type, t->data, t->nbytes, back, n);
        for (int64_t i = 0; i < n; i++) back[i] = x[i] - back[i];
        tiny_tensor * r = &res->t[res->n++];
        *r = *t;
        snprintf(r->name, sizeof(r->name), "%s.residual", name);
        r->type = res_type;
        r->nbytes = rm_row_bytes(res_type, ne0) * (uint64_t) (ne1 * ne2);
        r->data = (uint8_t *) malloc(r->nbytes);
        const int ok = r->nbytes && rm_quantize(res_type, back, ne1 * ne2, ne0, r->data, r->nbytes, 0) == RM_OK;
        free(back);
        if (!ok) {
            free(x);
            return -1;
        }
    }
    free(x);
    return 0;
}

static int tiny_save(const tiny_file * f, const char * arch, const tiny_spec * s, const char * path) {
    tiny_buf b = {0};
    const uint32_t align = 32;
    tiny_put(&b, "GGUF", 4);
    tiny_u32(&b, 3);
    tiny_u64(&b, (uint64_t) f->n);
    const int with_hparams = arch != NULL;
    tiny_u64(&b, with_hparams ? 13 : 0);
    if (with_hparams) {
        tiny_str(&b, "general.architecture");
        tiny_u32(&b, RM_GGUF_STRING);
        tiny_str(&b, arch);
        tiny_kv_u32(&b, arch, "embedding_length", (uint32_t) s->n_embd);
        tiny_kv_u32(&b, arch, "block_count", (uint32_t) s->n_layer);
        tiny_kv_u32(&b, arch, "attention.head_count", (uint32_t) s->n_head);
        tiny_kv_u32(&b, arch, "attention.head_count_kv", (uint32_t) s->n_head_kv);
        tiny_kv_u32(&b, arch, "attention.key_length", (uint32_t) s->head_dim);
        tiny_kv_u32(&b, arch, "expert_count", (uint32_t) s->n_expert);
        tiny_kv_u32(&b, arch, "expert_used_count", (uint32_t) s->n_expert_used);
        tiny_kv_u32(&b, arch, strcmp(arch, "llama") == 0 ? "feed_forward_length" : "expert_feed_forward_length",
                    (uint32_t) s->n_ff);
        tiny_kv_u32(&b, arch, "expert_shared_feed_forward_length", (uint32_t) s->n_ff_shexp);
        tiny_kv_u32(&b, arch, "context_length", (uint32_t) s->n_ctx);
        tiny_kv_f32(&b, arch, "attention.layer_norm_rms_epsilon", 1e-6f);
        tiny_kv_f32(&b, arch, "rope.freq_base", 10000.0f);
    }
    uint64_t off = 0;
    for (int i = 0; i < f->n; i++) {
        const tiny_tensor * t = &f->t[i];
        tiny_str(&b, t->name);
        tiny_u32(&b, (uint32_t) t->n_dims);
        for (int d = 0; d < t->n_dims; d++) tiny_u64(&b, (uint64_t) t->ne[d]);
        tiny_u32(&b, (uint32_t) t->type);
        tiny_u64(&b, off);
        off = (off + t->nbytes + align - 1) / align * align;
    }
    static const uint8_t zeros[32] = {0};
    tiny_put(&b, zeros, (align - b.n % align) % align);
    for (int i = 0; i < f->n; i++) {
        tiny_put(&b, f->t[i].data, f->t[i].nbytes);
        tiny_put(&b, zeros, (align - f->t[i].nbytes % align) % align);
    }
    FILE * fp = fopen(path, "wb");
    const int ok = fp && fwrite(b.p, 1, b.n, fp) == b.n;
    if (fp) fclose(fp);
    free(b.p);
    return ok ? 0 : -1;
}

static void tiny_free(tiny_file * f) {
    for (int i = 0; i < f->n; i++) free(f->t[i].data);
    f->n = 0;
}

/* Writes the base (and, when residual_type >= 0 and residual_path, the sidecar). 0 on success. */
static int tiny_write(const tiny_spec * s, const char * base_path, const char * residual_path) {
    tiny_file * f = (tiny_file *) calloc(1, sizeof(tiny_file));
    tiny_file * r = (tiny_file *) calloc(1, sizeof(tiny_file));
    uint64_t rng = s->seed * 0x9E3779B97F4A7C15ull + 1;
    const int64_t E = s->n_embd, Q = (int64_t) s->n_head * s->head_dim, KV = (int64_t) s->n_head_kv * s->head_dim;
    const int shexp = strcmp(s->arch, "qwen2moe") == 0, qk = strcmp(s->arch, "qwen3moe") == 0;
    tiny_file * rs = s->residual_type >= 0 && residual_path ? r : NULL;
    const float w = s->weight_std;
    int bad = 0;
    char name[96];
    bad |= tiny_add(f, NULL, -1, &rng, "token_embd", s->dense_type, 2, E, s->n_vocab, 1, 0.0f, 0.5f);
    bad |= tiny_add(f, NULL, -1, &rng, "output_norm", RM_TYPE_F32, 1, E, 1, 1, 1.0f, 0.1f);
    bad |= tiny_add(f, NULL, -1, &rng, "output", s->output_type, 2, E, s->n_vocab, 1, 0.0f, s->head_std);
    for (int il = 0; il < s->n_layer && !bad; il++) {
#define T(suffix, ...) (snprintf(name, sizeof(name), "blk.%d.%s", il, suffix), tiny_add(__VA_ARGS__))
        bad |= T("attn_norm", f, NULL, -1, &rng, name, RM_TYPE_F32, 1, E, 1, 1, 1.0f, 0.1f);
        bad |= T("attn_q", f, NULL, -1, &rng, name, s->dense_type, 2, E, Q, 1, 0.0f, w);
        bad |= T("attn_k", f, NULL, -1, &rng, name, s->dense_type, 2, E, KV, 1, 0.0f, w);
        bad |= T("attn_v", f, NULL, -1, &rng, name, s->dense_type, 2, E, KV, 1, 0.0f, w);
        bad |= T("attn_output", f, NULL, -1, &rng, name, s->dense_type, 2, Q, E, 1, 0.0f, w);
        if (shexp) {   /* tiny_add names tensors NAME.weight; biases are NAME.bias */
            bad |= T("attn_q", f, NULL, -1, &rng, name, RM_TYPE_F32, 1, Q, 1, 1, 0.0f, w);
            memcpy(f->t[f->n - 1].name + strlen(name), ".bias", 6);
            bad |= T("attn_k", f, NULL, -1, &rng, name, RM_TYPE_F32, 1, KV, 1, 1, 0.0f, w);
            memcpy(f->t[f->n - 1].name + strlen(name), ".bias", 6);
            bad |= T("attn_v", f, NULL, -1, &rng, name, RM_TYPE_F32, 1, KV, 1, 1, 0.0f, w);
            memcpy(f->t[f->n - 1].name + strlen(name), ".bias", 6);
        }
        if (qk) {
            bad |= T("attn_q_norm", f, NULL, -1, &rng, name, RM_TYPE_F32, 1, s->head_dim, 1, 1, 1.0f, 0.1f);
            bad |= T("attn_k_norm", f, NULL, -1, &rng, name, RM_TYPE_F32, 1, s->head_dim, 1, 1, 1.0f, 0.1f);
        }
        bad |= T("ffn_norm", f, NULL, -1, &rng, name, RM_TYPE_F32, 1, E, 1, 1, 1.0f, 0.1f);
        bad |= T("ffn_gate_inp", f, NULL, -1, &rng, name, RM_TYPE_F32, 2, E, s->n_expert, 1, 0.0f, 0.1f);
        bad |= T("ffn_gate_exps", f, rs, s->residual_type, &rng, name, s->expert_type, 3, E, s->n_ff, s->n_expert, 0.0f, w);
        bad |= T("ffn_up_exps", f, rs, s->residual_type, &rng, name, s->expert_type, 3, E, s->n_ff, s->n_expert, 0.0f, w);
        bad |= T("ffn_down_exps", f, rs, s->residual_type, &rng, name, s->expert_type, 3, s->n_ff, E, s->n_expert, 0.0f, w);
        if (shexp) {
            bad |= T("ffn_gate_shexp", f, NULL, -1, &rng, name, s->dense_type, 2, E, s->n_ff_shexp, 1, 0.0f, w);
            bad |= T("ffn_up_shexp", f, NULL, -1, &rng, name, s->dense_type, 2, E, s->n_ff_shexp, 1, 0.0f, w);
            bad |= T("ffn_down_shexp", f, NULL, -1, &rng, name, s->dense_type, 2, s->n_ff_shexp, E, 1, 0.0f, w);
            bad |= T("ffn_gate_inp_shexp", f, NULL, -1, &rng, name, RM_TYPE_F32, 1, E, 1, 1, 0.0f, 0.1f);
        }
#undef T
    }
    if (!bad) bad |= tiny_save(f, s->arch, s, base_path);
    if (!bad && rs) bad |= tiny_save(r, NULL, s, residual_path);
    tiny_free(f);
    tiny_free(r);
    free(f);
    free(r);
    return bad ? -1 : 0;
}

#endif
