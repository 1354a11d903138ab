/* test_backend_ops.c - every op of the backend table (backend.h) on random inputs (never zeros),
 * on the CPU backend and, where a GPU can be used, the CUDA backend, each against a double
 * precision reference computed here.
 *
 * Error budgets, relative to the size of the quantity (for a product, sum |w_k x_k|):
 *   matmul    CUDA 2e-5 for every type (weights dequantized exactly, fp32 activations and sums);
 *             CPU 2e-5 for F32/F16 weights, 1e-2 for quantized ones (activations rounded to Q8)
 *   attention 2e-5 of max |v| (also with a sliding window and sinks, and unscaled on heads of 512);
 *             rmsnorm (also without a weight), adds, swiglu, swiglu_clamp, geglu, rows 1e-5; scale
 *             exact; rope, rope_yarn and rope_div 2e-3 at position ~1000 (each computes the angle in
 *             float, as llama.cpp does); route: the same experts, weights within 1e-5; dsa_select and
 *             qsa_select: the picks of the reference, ascending; ple_gate 1e-5 of the value, ple_conv
 *             1e-5 of the terms, its states exact, a sequence cut into steps bit for bit as one;
 *             qsa_select: the picks of the reference, ascending; mhc_weights (20 Sinkhorn rounds),
 *             mhc_collapse, mhc_expand 1e-5 (the sums relative to the sum of their terms' sizes);
 *             compress 2e-4 of an entry's size at positions ~1000 (RoPE's angle in float);
 *             route_gated with sqrt(softplus) scores, by score + bias or by a hash table: the same
 *             experts, weights within 1e-5; csa_select: the picks of the reference, ascending;
 *             dsv4_attention 1e-5 of max |out|
 * Weights come from tiny models written at test time, one per weight type, so the CUDA backend
 * sees them exactly as a model load puts them on the device; the model with half its experts in
 * host memory checks the CUDA backend's host fallback for a matrix it does not hold.
 *
 *   test_backend_ops [--json PATH] */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "cpu/dispatch.h"
#include "device.h"
#include "model.h"
#include "tiny_gguf.h"
#include "types.h"
#include "expect.h"

static char json[1 << 15];
static size_t json_n;
static uint64_t rng = 0x1234567;


#define JSON(...) (json_n += (size_t) snprintf(json + json_n, sizeof(json) - json_n, __VA_ARGS__))

static void record(const char * be, const char * op, const char * what, double err, double tol) {
    JSON("%s{\"backend\":\"%s\",\"op\":\"%s\",\"case\":\"%s\",\"err\":%.3g,\"tol\":%.3g}", json_n > 1 ? "," : "", be, op,
         what, err, tol);
    EXPECT(err <= tol, "%s %s %s: error %.3g > %.3g", be, op, what, err, tol);
}

static float * randn(int64_t n, float scale) {
    float * x = malloc(sizeof(float) * (size_t) n);
    for (int64_t i = 0; i < n; i++) {
        x[i] = scale * tiny_gauss(&rng);
        if (x[i] == 0.0f) x[i] = scale * 1e-3f;
    }
    return x;
}

static float * put(rm_backend * be, const float * host, int64_t n) {
    float * p = be->ops->alloc(be, sizeof(float) * (uint64_t) n);
    if (p) be->ops->upload(be, p, host, sizeof(float) * (uint64_t) n);
    return p;
}

static float * get(rm_backend * be, const float * dev, int64_t n) {
    float * h = malloc(sizeof(float) * (size_t) n);
    be->ops->download(be, h, dev, sizeof(float) * (uint64_t) n);
    return h;
}

/* ---- ops ---------------------------------------------------------------------------------- */

static void test_matmul(rm_backend * be, const rm_weight * w, int64_t mat, const char * label, double tol) {
    const int64_t n_in = w->ne[0], n_out = w->ne[1];
    float * wd = malloc(sizeof(float) * (size_t) (n_in * n_out));
    rm_dequantize(w->type, rm_weight_matrix(w, mat), w->row_bytes * (uint64_t) n_out, wd, n_in * n_out);
    const int toks[] = {1, 2, 5, 8, 13, 17};   /* 17: the AMX tile form, where the set has one */
    double worst = 0;
    for (size_t ti = 0; ti < sizeof(toks) / sizeof(toks[0]); ti++) {
        for (int acc = 0; acc < 2; acc++) {
            const int n = toks[ti];
            const int64_t xs = n_in + 3, ys = n_out + 5;   /* strided rows */
            float * x = randn(n * xs, 1.0f), * y0 = randn(n * ys, 1.0f);
            float * xd = put(be, x, n * xs), * yd = put(be, y0, n * ys);
            rm_matmul_args a = {w, mat, xd, xs, n, yd, ys, acc};
            be->ops->matmul(be, &a);
            float * y = get(be, yd, n * ys);
            if (!strcmp(be->ops->name, "cpu")) {   /* a token's result does not depend on its batch */
                for (int t = 0; t < n; t++) {
                    float * y1 = put(be, y0 + t * ys, ys);
                    rm_matmul_args one = {w, mat, xd + t * xs, xs, 1, y1, ys, acc};
                    be->ops->matmul(be, &one);
                    float * got1 = get(be, y1, ys);
                    EXPECT(memcmp(got1, y + t * ys, sizeof(float) * (size_t) n_out) == 0,
                           "%s matmul %s: token %d of %d differs from the same token alone", be->ops->name, label, t, n);
                    be->ops->release(be, y1);
                    free(got1);
                }
            }
            for (int t = 0; t < n; t++) {
                for (int64_t r = 0; r < n_out; r++) {
                    double ref = acc ? y0[t * ys + r] : 0.0, mag = acc ? fabs(y0[t * ys + r]) : 0.0;
                    for (int64_t k = 0; k < n_in; k++) {
                        ref += (double) wd[r * n_in + k] * x[t * xs + k];
                        mag += fabs((double) wd[r * n_in + k] * x[t * xs + k]);
                    }
                    worst = fmax(worst, fabs(y[t * ys + r] - ref) / (mag + 1e-30));
                }
                for (int64_t r = n_out; r < ys; r++) {   /* the gaps between rows are untouched */
                    worst = fmax(worst, y[t * ys + r] == y0[t * ys + r] ? 0.0 : 1.0);
                }
            }
            be->ops->release(be, xd);
            be->ops->release(be, yd);
            free(x), free(y0), free(y);
        }
    }
    record(be->ops->name, "matmul", label, worst, tol);
    free(wd);
}

/* matmul_many against the same products one matmul at a time: the same arithmetic row by row,
 * so the same bits. Items mix token counts, shared and separate inputs (shared ones are quantized
 * once), residual rows (R: up_exps of the same expert) and accumulation. */
static void test_matmul_many(rm_backend * be, const rm_model * m, const char * label) {
    if (!be->ops->matmul_many) return;
    const rm_layer * L = &m->layers[0];
    const int64_t n_in = L->gate_exps.ne[0], n_out = L->gate_exps.ne[1];
    const int32_t X = (int32_t) L->gate_exps.ne[2], N = 5, n_items = 2 * X;
    const int64_t xs = n_in + 3, ys = n_out + 1;
    float * x = randn(N * xs * X, 1.0f), * y0 = randn(N * ys * n_items, 1.0f);
    float * xd = put(be, x, N * xs * X), * ya = put(be, y0, N * ys * n_items), * yb = put(be, y0, N * ys * n_items);
    rm_mm_item items[64];
    for (int32_t i = 0; i < n_items; i++) {
        const int32_t e = i % X, n = 1 + (i * 7) % N, acc = i % 3 == 2;
        const float * in = xd + (i % 4 == 1 ? 0 : (int64_t) e * N * xs);    /* some items share row 0's inputs */
        items[i] = (rm_mm_item) {{&L->gate_exps, e, in, xs, n, ya + (int64_t) i * N * ys, ys, acc}, &L->up_exps, (i * 5) % (n + 1)};
    }
    be->ops->matmul_many(be, items, n_items);
    for (int32_t i = 0; i < n_items; i++) {
        rm_matmul_args a = items[i].a;
        a.y = yb + (int64_t) i * N * ys;
        be->ops->matmul(be, &a);
        if (items[i].n_res > 0) {
            a.w = items[i].res, a.n_tok = items[i].n_res, a.accumulate = 1;
            be->ops->matmul(be, &a);
        }
    }
    float * got = get(be, ya, N * ys * n_items), * want = get(be, yb, N * ys * n_items);
    int64_t differ = 0;
    for (int64_t k = 0; k < N * ys * n_items; k++) differ += memcmp(&got[k], &want[k], sizeof(float)) != 0;
    record(be->ops->name, "matmul_many", label, (double) differ, 0.0);
    be->ops->release(be, xd), be->ops->release(be, ya), be->ops->release(be, yb);
    free(x), free(y0), free(got), free(want);
}

/* Attention of n_tok query rows at positions pos0.. against a double-precision reference: one
 * token (decode, the heads split among the threads), a few, contexts of several tiles of
 * positions (the CPU backend reads K and V in tiles for blocks of query rows that share a kv
 * head), groups of 2, 8 and 64 query heads per kv head (64: more than a job's 32 rows), a block
 * count that does not divide the tokens; with W > 0 a window (also one that starts mid-tile) and
 * a sink logit per head (the model's first F32 vector, attn_norm, values near 1, which every
 * backend holds), and with ring > 0 the cache laid out as a sliding layer's ring of `ring` rows,
 * position p in row p % ring, which wraps inside some tokens' windows and inside a tile. */
static void test_attention_any(rm_backend * be, const rm_model * m, int n_tok, int pos0, int D, int DV, int W, int ring,
                               int H, int HKV, float scale, int v_in_k) {
    const int G = H / HKV, N_CTX = pos0 + n_tok;
    const rm_weight * sinks = W > 0 ? &m->layers[0].attn_norm : NULL;
    const float * sk = sinks ? (const float *) sinks->data : NULL;
    float * q = randn(n_tok * H * D, 1.0f), * k = randn(N_CTX * HKV * D, 1.0f), * v = randn(N_CTX * HKV * DV, 1.0f);
    for (int r = 0; v_in_k && r < N_CTX * HKV; r++) {   /* the values: each key row's first DV floats */
        memcpy(v + r * DV, k + r * D, sizeof(float) * (size_t) DV);
    }
    const int rows = ring > 0 ? ring : N_CTX;
    float * kr = malloc(sizeof(float) * (size_t) (rows * HKV * D)), * vr = malloc(sizeof(float) * (size_t) (rows * HKV * DV));
    for (int p = 0; p < N_CTX; p++) {
        memcpy(kr + (p % rows) * HKV * D, k + p * HKV * D, sizeof(float) * (size_t) (HKV * D));
        memcpy(vr + (p % rows) * HKV * DV, v + p * HKV * DV, sizeof(float) * (size_t) (HKV * DV));
    }
    float * qd = put(be, q, n_tok * H * D), * kd = put(be, kr, rows * HKV * D), * vd = put(be, vr, rows * HKV * DV);
    float * od = be->ops->alloc(be, sizeof(float) * (uint64_t) (n_tok * H * DV));
    rm_attn_args a = {qd, kd, vd, od, n_tok, pos0, H, HKV, D, W, sinks, ring};
    a.scale = scale;
    a.head_dim_v = DV == D ? 0 : DV;
    a.v_in_k = v_in_k;
    be->ops->attention(be, &a);
    float * o = get(be, od, n_tok * H * DV);
    double * s = malloc(sizeof(double) * (size_t) N_CTX), worst = 0;
    for (int i = 0; i < n_tok; i++) {
        for (int h = 0; h < H; h++) {
            const int n_kv = pos0 + i + 1, p0 = W > 0 && n_kv > W ? n_kv - W : 0, kh = h / G;
            double mx = sk ? sk[h] : -1e300, z = 0;
            for (int p = p0; p < n_kv; p++) {
                double d = 0;
                for (int c = 0; c < D; c++) d += (double) q[(i * H + h) * D + c] * k[(p * HKV + kh) * D + c];
                s[p] = scale > 0.0f ? d * scale : d / sqrt((double) D);
                mx = fmax(mx, s[p]);
            }
            if (sk) z = exp(sk[h] - mx);
            for (int p = p0; p < n_kv; p++) z += exp(s[p] - mx);
            for (int c = 0; c < DV; c++) {
                double ref = 0;
                for (int p = p0; p < n_kv; p++) ref += exp(s[p] - mx) / z * v[(p * HKV + kh) * DV + c];
                worst = fmax(worst, fabs(o[(i * H + h) * DV + c] - ref));
            }
        }
    }
    char what[128];
    snprintf(what, sizeof(what), "%d tokens at %d, head_dim %d/%d, window %d, ring %d, %d/%d heads%s%s", n_tok, pos0, D,
             DV, W, ring, H, HKV, scale > 0.0f ? ", logits unscaled" : "", v_in_k ? ", values in the keys" : "");
    record(be->ops->name, "attention", what, worst / 4.0, 2e-5);
    be->ops->release(be, qd), be->ops->release(be, kd), be->ops->release(be, vd), be->ops->release(be, od);
    free(q), free(k), free(v), free(o), free(kr), free(vr), free(s);
}

static void test_attention_full(rm_backend * be, const rm_model * m, int n_tok, int pos0, int D, int DV, int W, int ring,
                                int H, int HKV, float scale) {
    test_attention_any(be, m, n_tok, pos0, D, DV, W, ring, H, HKV, scale, 0);
}

/* The kernel set's conversions of cache rows to floats (its own for F16 and IQ4_NL, the types'
 * for the rest) against the types' own, bit for bit: attention reads a cache through them. Rows
 * of random floats quantized by the type. */
static void test_dequantize_equal(void) {
    const int32_t types[] = {RM_TYPE_F16, RM_TYPE_IQ4_NL, RM_TYPE_Q8_0, RM_TYPE_Q4_0};
    const int64_t n = 576;   /* a latent row: 18 blocks of 32 */
    float * x = randn(n, 3.0f), * want = malloc(sizeof(float) * n), * got = malloc(sizeof(float) * n);
    uint8_t * row = malloc(sizeof(float) * n);
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
        const rm_type_traits * t = rm_type_traits_get(types[i]);
        t->from_float(x, row, n);
        t->to_float(row, want, n);
        rm_cpu_dequantize(types[i])(row, got, n);
        int64_t differ = 0;
        for (int64_t j = 0; j < n; j++) differ += memcmp(&got[j], &want[j], sizeof(float)) != 0;
        record(rm_isa_name(rm_isa_active()), "dequantize", t->name, (double) differ, 0.0);
    }
    free(x), free(want), free(got), free(row);
}

/* Tokens one at a time against the same tokens in one call, past two segments of 512 positions:
 * one token's rows are split between the threads by segments and merged at the end, the call's
 * rows (more than a job holds) merge the same segments inside each job; the same floats, bit for
 * bit, the window with sinks on a ring too. Random keys keep every segment's share of the weight. */
static void test_attention_split_equal(rm_backend * be, const rm_model * m, int W, int ring) {
    const int n_tok = 6, pos0 = 1300, H = 32, HKV = 4, D = 64, N_CTX = pos0 + n_tok, rows = ring > 0 ? ring : N_CTX;
    const rm_weight * sinks = W > 0 ? &m->layers[0].attn_norm : NULL;
    float * q = randn(n_tok * H * D, 1.0f), * k = randn(rows * HKV * D, 1.0f), * v = randn(rows * HKV * D, 1.0f);
    float * qd = put(be, q, n_tok * H * D), * kd = put(be, k, rows * HKV * D), * vd = put(be, v, rows * HKV * D);
    float * od = be->ops->alloc(be, sizeof(float) * (uint64_t) (n_tok * H * D));
    float * od1 = be->ops->alloc(be, sizeof(float) * (uint64_t) (n_tok * H * D));
    rm_attn_args a = {qd, kd, vd, od, n_tok, pos0, H, HKV, D, W, sinks, ring};
    be->ops->attention(be, &a);
    for (int i = 0; i < n_tok; i++) {
        rm_attn_args a1 = {qd + i * H * D, kd, vd, od1 + i * H * D, 1, pos0 + i, H, HKV, D, W, sinks, ring};
        be->ops->attention(be, &a1);
    }
    float * all = get(be, od, n_tok * H * D), * one = get(be, od1, n_tok * H * D);
    int64_t differ = 0;
    for (int64_t j = 0; j < (int64_t) n_tok * H * D; j++) differ += memcmp(&all[j], &one[j], sizeof(float)) != 0;
    char what[64];
    snprintf(what, sizeof(what), "one token at a time, window %d, ring %d", W, ring);
    record(be->ops->name, "attention", what, (double) differ, 0.0);
    be->ops->release(be, qd), be->ops->release(be, kd), be->ops->release(be, vd), be->ops->release(be, od);
    be->ops->release(be, od1);
    free(q), free(k), free(v), free(all), free(one);
}

static void test_attention_scaled(rm_backend * be, const rm_model * m, int n_tok, int pos0, int D, int W, int ring, int H,
                                  int HKV, float scale) {
    test_attention_full(be, m, n_tok, pos0, D, D, W, ring, H, HKV, scale);
}

static void test_attention_case(rm_backend * be, const rm_model * m, int n_tok, int pos0, int D, int W, int ring, int H,
                                int HKV) {
    test_attention_scaled(be, m, n_tok, pos0, D, W, ring, H, HKV, 0.0f);
}

/* Gemma 4's: the GELU-gated product (rows apart, and gate and up side by side in rows of 2F), a
 * scale, RoPE with its frequencies divided (the divisors here a model's norm weights), the
 * unweighted RMSNorm, and attention with unscaled logits on heads of 256 and 512. */
static void test_gemma4_ops(rm_backend * be, const rm_model * m) {
    const int64_t F = 37, R = 5;
    float * g = randn(R * 2 * F, 2.0f), * u = randn(R * F, 2.0f);
    float * gd = put(be, g, R * 2 * F), * ud = put(be, u, R * F);
    be->ops->geglu(be, gd, 2 * F, gd + F, 2 * F, F, R);   /* fused: up is the second half of each row */
    float * fused = get(be, gd, R * 2 * F);
    be->ops->upload(be, gd, g, sizeof(float) * (uint64_t) (R * 2 * F));
    be->ops->geglu(be, gd, F, ud, F, F, R);              /* apart: rows of F */
    float * apart = get(be, gd, R * 2 * F);
    double e = 0;
    for (int64_t r = 0; r < R; r++) {
        for (int64_t j = 0; j < F; j++) {
            const double x = g[r * 2 * F + j], x2 = g[r * F + j];
            const double gelu = 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
            const double gelu2 = 0.5 * x2 * (1.0 + tanh(0.7978845608028654 * (x2 + 0.044715 * x2 * x2 * x2)));
            const double want = gelu * g[r * 2 * F + F + j], want2 = gelu2 * u[r * F + j];
            e = fmax(e, fabs(fused[r * 2 * F + j] - want) / (fabs(want) + 1.0));
            e = fmax(e, fabs(apart[r * F + j] - want2) / (fabs(want2) + 1.0));
            e = fmax(e, fused[r * 2 * F + F + j] == g[r * 2 * F + F + j] ? 0.0 : 1.0);   /* up untouched */
        }
    }
    record(be->ops->name, "geglu", "rows apart and fused", e, 1e-5);
    be->ops->upload(be, gd, g, sizeof(float) * (uint64_t) (R * 2 * F));
    be->ops->scale(be, gd, R * F, -0.375f);
    float * sc = get(be, gd, R * 2 * F);
    e = 0;
    for (int64_t i = 0; i < R * 2 * F; i++) {
        volatile float want = i < R * F ? -0.375f * g[i] : g[i];   /* rounded to float: no fused multiply-add */
        e = fmax(e, sc[i] == want ? 0.0 : 1.0);
    }
    record(be->ops->name, "scale", "", e, 0.0);
    /* rmsnorm without a weight */
    be->ops->rmsnorm(be, gd, gd, NULL, R, 2 * F, 1e-6f);
    float * nrm = get(be, gd, R * 2 * F);
    e = 0;
    for (int64_t r = 0; r < R; r++) {
        double ss = 0;
        for (int64_t j = 0; j < 2 * F; j++) ss += (double) sc[r * 2 * F + j] * sc[r * 2 * F + j];
        const double f = 1.0 / sqrt(ss / (double) (2 * F) + 1e-6);
        for (int64_t j = 0; j < 2 * F; j++) e = fmax(e, fabs(nrm[r * 2 * F + j] - sc[r * 2 * F + j] * f));
    }
    record(be->ops->name, "rmsnorm", "no weight", e, 1e-5);
    /* rope_div: NEOX over a head of 64, pair i's frequency divided by div[i] */
    const int n_tok = 3, H = 4, D = 64, n_rot = 64, pos0 = 1000;
    const rm_weight * div = &m->layers[0].attn_norm;   /* F32, at least n_rot / 2 positive entries */
    float * x = randn(n_tok * H * D, 1.0f);
    float * xd = put(be, x, n_tok * H * D);
    be->ops->rope_div(be, xd, n_tok, H, D, n_rot, pos0, 1000000.0f, 1, div);
    float * y = get(be, xd, n_tok * H * D);
    e = 0;
    for (int t = 0; t < n_tok; t++) {
        for (int h = 0; h < H; h++) {
            const float * v = x + (t * H + h) * D, * o = y + (t * H + h) * D;
            for (int i = 0; i < n_rot / 2; i++) {
                const double ang = (double) (pos0 + t) * pow(1000000.0, -2.0 * i / n_rot) / ((const float *) div->data)[i];
                const int a = i, b = i + n_rot / 2;
                e = fmax(e, fabs(o[a] - (v[a] * cos(ang) - v[b] * sin(ang))));
                e = fmax(e, fabs(o[b] - (v[a] * sin(ang) + v[b] * cos(ang))));
            }
        }
    }
    record(be->ops->name, "rope_div", "neox, divided", e, 2e-3);
    test_attention_scaled(be, m, 6, 17, 256, 5, 11, 4, 2, 1.0f);   /* a sliding layer's: window and ring */
    test_attention_scaled(be, m, 3, 40, 512, 0, 0, 8, 1, 1.0f);    /* a full layer's head of 512 */
    be->ops->release(be, gd), be->ops->release(be, ud), be->ops->release(be, xd);
    free(g), free(u), free(fused), free(apart), free(sc), free(nrm), free(x), free(y);
}

/* The cases that fit every backend's context of 64 positions. */
static void test_attention_small(rm_backend * be, const rm_model * m) {
    for (int D = 64; D <= 128; D += 64) {
        test_attention_case(be, m, 1, 0, D, 0, 0, 4, 2);
        test_attention_case(be, m, 6, 37, D, 0, 0, 4, 2);   /* past one block of 32 positions */
    }
    test_attention_case(be, m, 6, 17, 64, 5, 0, 4, 2);    /* gpt-oss: a window of 5 and sinks */
    test_attention_case(be, m, 6, 17, 64, 5, 11, 4, 2);   /* the same on a ring of 11 rows */
    /* MiMo's: values of 128 against keys of 192, a window with sinks on a ring, and a long prefix */
    test_attention_full(be, m, 6, 17, 192, 128, 5, 11, 8, 2, 0.0f);
    test_attention_full(be, m, 5, 150, 192, 128, 0, 0, 8, 1, 0.0f);
    test_attention_full(be, m, 1, 70, 24, 16, 0, 0, 4, 1, 0.0f);
}

/* gpt-oss's and DeepSeek-V4's clamped SwiGLUs on values that reach past the limit, and YaRN RoPE
 * (factor 32). */
static void test_gpt_oss_ops(rm_backend * be) {
    const int64_t n = 300;
    float * g = randn(n, 6.0f), * u = randn(n, 6.0f);
    float * gd = put(be, g, n), * ud = put(be, u, n);
    be->ops->swiglu_clamp(be, gd, ud, n, RM_SWIGLU_OAI_ALPHA, RM_SWIGLU_OAI_LIMIT);
    float * y = get(be, gd, n);
    double e = 0;
    for (int64_t j = 0; j < n; j++) {
        const double x = fmin(g[j], 7.0), up = fmax(-7.0, fmin(u[j], 7.0));
        const double ref = x / (1.0 + exp(-1.702 * x)) * (up + 1.0);
        e = fmax(e, fabs(y[j] - ref) / (1.0 + fabs(ref)));
    }
    record(be->ops->name, "swiglu_clamp", "|x| up to ~20", e, 1e-5);
    /* DeepSeek-V4's: the gate clamped before silu, no + 1 (limit 10) */
    be->ops->upload(be, gd, g, sizeof(float) * (uint64_t) n);
    be->ops->swiglu_clamp(be, gd, ud, n, RM_SWIGLU_DSV4_ALPHA, 10.0f);
    free(y);
    y = get(be, gd, n);
    e = 0;
    for (int64_t j = 0; j < n; j++) {
        const double x = fmin(g[j], 10.0), up = fmax(-10.0, fmin(u[j], 10.0));
        const double ref = x / (1.0 + exp(-x)) * up;
        e = fmax(e, fabs(y[j] - ref) / (1.0 + fabs(ref)));
    }
    record(be->ops->name, "swiglu_clamp", "DeepSeek-V4's, |x| up to ~20", e, 1e-5);
    be->ops->release(be, gd), be->ops->release(be, ud);
    free(g), free(u), free(y);

    const int n_tok = 3, H = 4, D = 64, n_rot = 64, pos0 = 1000;
    rm_hparams hp = {0};
    hp.n_rot = n_rot, hp.rope_base = 150000.0f, hp.rope_yarn_factor = 32.0f, hp.n_ctx_orig_yarn = 4096;
    hp.yarn_beta_fast = 32.0f, hp.yarn_beta_slow = 1.0f, hp.yarn_truncate = 1;
    rm_rope_yarn yp;
    rm_rope_yarn_of(&hp, &yp);
    /* the released gpt-oss's correction range, as llama.cpp computes it */
    EXPECT(yp.corr_lo == 8.0f && yp.corr_hi == 18.0f && fabsf(yp.mscale - 1.34657359f) < 1e-6f,
           "yarn range [%g, %g], mscale %g", yp.corr_lo, yp.corr_hi, yp.mscale);
    float * x = randn(n_tok * H * D, 1.0f);
    float * xd = put(be, x, n_tok * H * D);
    be->ops->rope_yarn(be, xd, n_tok, H, D, n_rot, pos0, &yp, 1);
    float * o = get(be, xd, n_tok * H * D);
    e = 0;
    for (int t = 0; t < n_tok; t++) {
        for (int h = 0; h < H; h++) {
            const float * vv = x + (t * H + h) * D, * oo = o + (t * H + h) * D;
            for (int i = 0; i < n_rot / 2; i++) {
                const double inv = pow(150000.0, -2.0 * i / n_rot);
                const double keep = 1.0 - fmin(1.0, fmax(0.0, (i - 8.0) / 10.0));
                const double ang = (double) (pos0 + t) * (inv / 32.0 * (1.0 - keep) + inv * keep);
                const double ms = 1.0 + 0.1 * log(32.0);
                const int a = i, b = i + n_rot / 2;
                e = fmax(e, fabs(oo[a] - ms * (vv[a] * cos(ang) - vv[b] * sin(ang))));
                e = fmax(e, fabs(oo[b] - ms * (vv[a] * sin(ang) + vv[b] * cos(ang))));
            }
        }
    }
    record(be->ops->name, "rope_yarn", "factor 32", e, 2e-3);
    be->ops->release(be, xd);
    free(x), free(o);
}

static void test_rows_and_adds(rm_backend * be, const rm_model * m) {
    const rm_layer * L = &m->layers[0];
    const int64_t R = 5, N = m->hp.n_embd;
    float * x = randn(R * N, 1.0f), * y0 = randn(R * N, 1.0f), * g = randn(R, 2.0f);
    float * xd = put(be, x, R * N), * yd = put(be, y0, R * N), * gd = put(be, g, R);
    double e;
    /* rmsnorm */
    be->ops->rmsnorm(be, yd, xd, &L->attn_norm, R, N, 1e-6f);
    float * y = get(be, yd, R * N);
    e = 0;
    for (int64_t i = 0; i < R; i++) {
        double ss = 0;
        for (int64_t j = 0; j < N; j++) ss += (double) x[i * N + j] * x[i * N + j];
        const double sc = 1.0 / sqrt(ss / N + 1e-6);
        for (int64_t j = 0; j < N; j++) {
            const double ref = x[i * N + j] * sc * ((const float *) L->attn_norm.data)[j];
            e = fmax(e, fabs(y[i * N + j] - ref) / (fabs(ref) + 1e-3));
        }
    }
    record(be->ops->name, "rmsnorm", "5 rows", e, 1e-5);
    free(y);
    /* add, add_gated, swiglu */
    be->ops->upload(be, yd, y0, sizeof(float) * (uint64_t) (R * N));
    be->ops->add(be, yd, xd, R * N);
    be->ops->add_gated(be, yd, xd, gd, R, N);
    be->ops->swiglu(be, yd, xd, R * N);
    y = get(be, yd, R * N);
    e = 0;
    for (int64_t i = 0; i < R * N; i++) {
        double v = (double) y0[i] + x[i];
        v += x[i] / (1.0 + exp(-(double) g[i / N]));
        v = v / (1.0 + exp(-v)) * x[i];
        e = fmax(e, fabs(y[i] - v) / (fabs(v) + 1e-3));
    }
    record(be->ops->name, "add+add_gated+swiglu", "5 rows", e, 1e-5);
    free(y);
    /* add_bias, when the model has one */
    if (L->bq.data) {
        const int64_t Q = L->bq.ne[0];
        float * q0 = randn(3 * Q, 1.0f);
        float * qd = put(be, q0, 3 * Q);
        be->ops->add_bias(be, qd, &L->bq, 3, Q);
        float * q = get(be, qd, 3 * Q);
        e = 0;
        for (int64_t i = 0; i < 3 * Q; i++) e = fmax(e, fabs(q[i] - (q0[i] + ((const float *) L->bq.data)[i % Q])));
        record(be->ops->name, "add_bias", "3 rows", e, 1e-6);
        be->ops->release(be, qd);
        free(q0), free(q);
    }
    /* gather_rows, scatter_add (rows repeat) */
    const int32_t rows[7] = {4, 0, 2, 2, 1, 4, 3};
    const float scale[7] = {0.5f, -1.0f, 2.0f, 0.25f, 1.5f, -0.75f, 1.0f};
    float * gdv = be->ops->alloc(be, sizeof(float) * (uint64_t) (7 * N));
    be->ops->gather_rows(be, gdv, xd, rows, 7, N);
    float * gh = get(be, gdv, 7 * N);
    e = 0;
    for (int j = 0; j < 7; j++)
        for (int64_t c = 0; c < N; c++) e = fmax(e, fabs(gh[j * N + c] - x[rows[j] * N + c]));
    record(be->ops->name, "gather_rows", "7 rows", e, 0.0);
    be->ops->upload(be, yd, y0, sizeof(float) * (uint64_t) (R * N));
    be->ops->scatter_add(be, yd, gdv, rows, scale, 7, N);
    y = get(be, yd, R * N);
    e = 0;
    for (int64_t i = 0; i < R; i++) {
        for (int64_t c = 0; c < N; c++) {
            double v = y0[i * N + c];
            for (int j = 0; j < 7; j++) if (rows[j] == i) v += (double) scale[j] * x[rows[j] * N + c];
            e = fmax(e, fabs(y[i * N + c] - v) / (fabs(v) + 1e-3));
        }
    }
    record(be->ops->name, "scatter_add", "7 rows into 5", e, 1e-5);
    /* copy, zero */
    be->ops->copy(be, yd, xd, sizeof(float) * (uint64_t) (R * N));
    be->ops->zero(be, xd, sizeof(float) * (uint64_t) N);
    float * yc = get(be, yd, R * N), * xz = get(be, xd, N);
    e = memcmp(yc, x, sizeof(float) * (size_t) (R * N)) != 0;
    for (int64_t c = 0; c < N; c++) e = fmax(e, fabs(xz[c]));
    record(be->ops->name, "copy+zero", "", e, 0.0);
    /* copy_rows: the first 3 of every other 7 floats of x into rows of 3 (gated attention's split) */
    const int64_t nr = (R - 1) * N / 14;   /* from row 1 of x (row 0 was zeroed on the backend) */
    float * rd = be->ops->alloc(be, sizeof(float) * (uint64_t) (3 * nr));
    be->ops->copy_rows(be, rd, 3, xd + N, 14, 3, nr);
    float * rh = get(be, rd, 3 * nr);
    e = 0;
    for (int64_t r = 0; r < nr; r++)
        for (int64_t c = 0; c < 3; c++) e = fmax(e, fabs(rh[r * 3 + c] - x[N + r * 14 + c]));
    record(be->ops->name, "copy_rows", "strided rows", e, 0.0);
    /* mul_sigmoid: y /= 1 + exp(-gate), a gate per element and a gate per row of 8 */
    be->ops->upload(be, yd, y0, sizeof(float) * (uint64_t) (R * N));
    be->ops->mul_sigmoid(be, yd, xd + N, (R - 1) * N, 1);
    float * ym = get(be, yd, R * N);
    e = 0;
    for (int64_t i = 0; i < (R - 1) * N; i++) {
        const double v = y0[i] / (1.0 + exp(-(double) x[N + i]));
        e = fmax(e, fabs(ym[i] - v) / (fabs(v) + 1e-3));
    }
    for (int64_t i = (R - 1) * N; i < R * N; i++) e = fmax(e, ym[i] == y0[i] ? 0.0 : 1.0);   /* past n: untouched */
    record(be->ops->name, "mul_sigmoid", "4 rows", e, 1e-6);
    free(ym);
    be->ops->upload(be, yd, y0, sizeof(float) * (uint64_t) (R * N));
    be->ops->mul_sigmoid(be, yd, xd + N, (R - 1) * N / 8, 8);
    ym = get(be, yd, R * N);
    e = 0;
    for (int64_t i = 0; i < (R - 1) * N / 8 * 8; i++) {
        const double v = y0[i] / (1.0 + exp(-(double) x[N + i / 8]));
        e = fmax(e, fabs(ym[i] - v) / (fabs(v) + 1e-3));
    }
    for (int64_t i = (R - 1) * N / 8 * 8; i < R * N; i++) e = fmax(e, ym[i] == y0[i] ? 0.0 : 1.0);
    record(be->ops->name, "mul_sigmoid", "a gate per row of 8", e, 1e-6);
    be->ops->release(be, xd), be->ops->release(be, yd), be->ops->release(be, gd), be->ops->release(be, gdv);
    be->ops->release(be, rd);
    free(x), free(y0), free(g), free(y), free(gh), free(yc), free(xz), free(rh), free(ym);
}

static void test_rope(rm_backend * be) {
    const int n_tok = 3, H = 4, D = 64, n_rot = 64, pos0 = 1000;
    for (int neox = 0; neox < 2; neox++) {
        float * x = randn(n_tok * H * D, 1.0f);
        float * xd = put(be, x, n_tok * H * D);
        be->ops->rope(be, xd, n_tok, H, D, n_rot, pos0, 10000.0f, neox);
        float * y = get(be, xd, n_tok * H * D);
        double e = 0;
        for (int t = 0; t < n_tok; t++) {
            for (int h = 0; h < H; h++) {
                const float * v = x + (t * H + h) * D;
                const float * o = y + (t * H + h) * D;
                for (int i = 0; i < n_rot / 2; i++) {
                    const double ang = (double) (pos0 + t) * pow(10000.0, -2.0 * i / n_rot);
                    const int a = neox ? i : 2 * i, b = neox ? i + n_rot / 2 : 2 * i + 1;
                    e = fmax(e, fabs(o[a] - (v[a] * cos(ang) - v[b] * sin(ang))));
                    e = fmax(e, fabs(o[b] - (v[a] * sin(ang) + v[b] * cos(ang))));
                }
            }
        }
        record(be->ops->name, "rope", neox ? "neox" : "norm", e, 2e-3);
        be->ops->release(be, xd);
        free(x), free(y);
    }
}

static void test_route(rm_backend * be) {
    const int experts[] = {8, 60, 128, 512}, ks[] = {1, 2, 8};
    double e = 0;
    int mismatched = 0;
    for (int ei = 0; ei < 4; ei++) {
        for (int ki = 0; ki < 3; ki++) {
            for (int norm = 0; norm < 2; norm++) {
                const int X = experts[ei], K = ks[ki], T = 3;
                if (K > X) continue;
                float * z = randn(T * X, 2.0f);
                float * zd = put(be, z, T * X);
                rm_route r[3 * 8];
                be->ops->route(be, zd, T, X, K, norm, r);
                for (int t = 0; t < T; t++) {
                    double mx = -1e300, s = 0, picked = 0;
                    for (int j = 0; j < X; j++) mx = fmax(mx, z[t * X + j]);
                    for (int j = 0; j < X; j++) s += exp(z[t * X + j] - mx);
                    uint8_t taken[512] = {0};
                    int best[8];
                    for (int k = 0; k < K; k++) {
                        best[k] = -1;
                        for (int j = 0; j < X; j++)
                            if (!taken[j] && (best[k] < 0 || z[t * X + j] > z[t * X + best[k]])) best[k] = j;
                        taken[best[k]] = 1;
                        picked += exp(z[t * X + best[k]] - mx) / s;
                    }
                    for (int k = 0; k < K; k++) {
                        const double p = exp(z[t * X + best[k]] - mx) / s;
                        const double w = norm ? p / picked : p;
                        mismatched += r[t * K + k].expert != best[k];
                        e = fmax(e, fabs(r[t * K + k].weight - w));
                        e = fmax(e, fabs(r[t * K + k].prob - p));
                    }
                }
                be->ops->release(be, zd);
                free(z);
            }
        }
    }
    record(be->ops->name, "route", "experts chosen", (double) mismatched, 0.0);
    record(be->ops->name, "route", "weights", e, 1e-5);
}

/* DeepSeek-V4's routers (transformers' DeepseekV4TopKRouter and DeepseekV4HashRouter): scores
 * sqrt(softplus(logits)), the top k of score + bias or the k a hash table's row names, weights the
 * scores of those renormalised and scaled by 1.5; logits up to 25 in size (softplus's linear part). */
static void test_route_dsv4(rm_backend * be) {
    enum { X = 16, K = 4, T = 3 };
    float * z = randn(T * X, 8.0f), * bv = randn(X, 0.5f);
    z[3] = 25.0f, z[X + 5] = -25.0f;
    const int32_t hash[T * K] = {3, 0, 15, 7, 1, 2, 3, 4, 9, 8, 6, 5};
    rm_weight bias = {RM_TYPE_F32, {X, 1, 1, 1}, (const uint8_t *) bv, sizeof(float) * X};
    float * zd = put(be, z, T * X);
    for (int hashed = 0; hashed < 2; hashed++) {
        rm_gating_params g = {RM_GATING_SQRT_SOFTPLUS, 1, 1, 1, 1.5f, hashed ? hash : NULL};
        rm_route r[T * K];
        be->ops->route_gated(be, zd, hashed ? NULL : &bias, &g, T, X, K, r);
        double e = 0;
        int mismatched = 0;
        for (int t = 0; t < T; t++) {
            double p[X], sum = 0;
            for (int j = 0; j < X; j++) p[j] = sqrt(log1p(exp((double) z[t * X + j])));
            int best[K];
            uint8_t taken[X] = {0};
            for (int k = 0; k < K; k++) {
                best[k] = -1;
                for (int j = 0; j < X && !hashed; j++)
                    if (!taken[j] && (best[k] < 0 || p[j] + bv[j] > p[best[k]] + bv[best[k]])) best[k] = j;
                if (hashed) best[k] = hash[t * K + k];
                taken[best[k]] = 1;
                sum += p[best[k]];
            }
            for (int k = 0; k < K; k++) {
                mismatched += r[t * K + k].expert != best[k];
                e = fmax(e, fabs(r[t * K + k].weight - 1.5 * p[best[k]] / sum) / (1.5 * p[best[k]] / sum));
            }
        }
        record(be->ops->name, "route_gated", hashed ? "sqrt(softplus), hash: experts" : "sqrt(softplus): experts",
               (double) mismatched, 0.0);
        record(be->ops->name, "route_gated", hashed ? "sqrt(softplus), hash: weights" : "sqrt(softplus): weights", e, 1e-5);
    }
    be->ops->release(be, zd);
    free(z), free(bv);
}

/* Sparse attention's ops (NULL where a backend runs none): a LayerNorm with a bias, and the pick
 * of each token's top_k positions by sum_h w_h relu(q_h . k_j) over keys cached after a latent of
 * LAT floats, in F32 rows and in F16 ones (read as floats), for two sequences: one of 5 tokens at
 * positions 295.. and one of a token at position 9 (which sees no more than top_k: its row is left
 * as it was). Random floats have no ties: the picked sets must be the reference's exactly. */
/* The hyper-connections' ops (qwen4exp) against double sums: a grouped RMSNorm (3 streams of 40, a
 * gamma per stream), silu(x / 3), the streams' gated mean and the weighted add of a block's output. */
static void test_hc_ops(rm_backend * be) {
    if (!be->ops->rmsnorm_groups) return;
    enum { N = 40, HC = 3, T = 5 };
    float * x = randn(T * HC * N, 1.5f), * wv = randn(HC * N, 1.0f), * g = randn(T * HC * N, 2.0f);
    float * b = randn(T * N, 1.0f), * inj = randn(T * HC, 3.0f);
    rm_weight w = {RM_TYPE_F32, {HC * N, 1, 1, 1}, (const uint8_t *) wv, sizeof(float) * HC * N};
    float * xd = put(be, x, T * HC * N), * yd = put(be, x, T * HC * N);
    be->ops->rmsnorm_groups(be, yd, xd, &w, T * HC, N, HC, 1e-6f);
    float * y = get(be, yd, T * HC * N);
    double e = 0;
    for (int r = 0; r < T * HC; r++) {
        double ss = 0;
        for (int j = 0; j < N; j++) ss += (double) x[r * N + j] * x[r * N + j];
        for (int j = 0; j < N; j++) {
            const double ref = x[r * N + j] / sqrt(ss / N + 1e-6) * wv[(r % HC) * N + j];
            e = fmax(e, fabs(y[r * N + j] - ref) / (fabs(ref) + 1e-3));
        }
    }
    record(be->ops->name, "rmsnorm_groups", "5 tokens of 3 streams", e, 1e-5);
    be->ops->upload(be, yd, x, sizeof(float) * T * HC * N);
    be->ops->silu(be, yd, T * HC * N, 1.0f / HC);
    free(y);
    y = get(be, yd, T * HC * N);
    e = 0;
    for (int i = 0; i < T * HC * N; i++) {
        const double v = x[i] / (double) HC, ref = v / (1.0 + exp(-v));
        e = fmax(e, fabs(y[i] - ref) / (fabs(ref) + 1e-3));
    }
    record(be->ops->name, "silu", "scaled by 1/3", e, 1e-6);
    float * gd = put(be, g, T * HC * N), * md = be->ops->alloc(be, sizeof(float) * T * N);
    be->ops->hc_mix(be, md, xd, gd, T, HC, N);
    float * mh = get(be, md, T * N);
    e = 0;
    for (int t = 0; t < T; t++) {
        for (int j = 0; j < N; j++) {
            double ref = 0;
            for (int c = 0; c < HC; c++) {
                const int i = (t * HC + c) * N + j;
                ref += x[i] / (1.0 + exp(-(double) g[i])) / HC;
            }
            e = fmax(e, fabs(mh[t * N + j] - ref) / (fabs(ref) + 1e-3));
        }
    }
    record(be->ops->name, "hc_mix", "5 tokens of 3 streams", e, 1e-5);
    float * bd = put(be, b, T * N), * id = put(be, inj, T * HC);
    be->ops->upload(be, yd, x, sizeof(float) * T * HC * N);
    be->ops->hc_add(be, yd, bd, id, T, HC, N);
    free(y);
    y = get(be, yd, T * HC * N);
    e = 0;
    for (int t = 0; t < T; t++) {
        for (int c = 0; c < HC; c++) {
            const double wt = 2.0 / (1.0 + exp(-(double) inj[t * HC + c] / HC));
            for (int j = 0; j < N; j++) {
                const int i = (t * HC + c) * N + j;
                const double ref = x[i] + wt * b[t * N + j];   /* relative to the terms: they may cancel */
                e = fmax(e, fabs(y[i] - ref) / (fabs(x[i]) + fabs(wt * b[t * N + j]) + 1e-3));
            }
        }
    }
    record(be->ops->name, "hc_add", "5 tokens of 3 streams", e, 1e-6);
    be->ops->release(be, xd), be->ops->release(be, yd), be->ops->release(be, gd), be->ops->release(be, md);
    be->ops->release(be, bd), be->ops->release(be, id);
    free(x), free(wv), free(g), free(b), free(inj), free(y), free(mh);
}

/* PLE's gate and dilated conv (qwen4exp) against doubles: 3 streams of 24 over 6 tokens; the conv
 * over two sequences (one with a state of earlier rows, one starting empty), its new states, and the
 * first sequence cut into steps of 2 and 4 rows giving the same floats. */
static void test_ple_ops(rm_backend * be) {
    if (!be->ops->ple_gate) return;
    enum { N = 24, HC = 3, T = 6, W = HC * N, K = 4, D = 3, S = (K - 1) * D };
    float * key = randn(T * W, 1.0f), * query = randn(T * W, 1.0f), * value = randn(T * N, 1.0f);
    for (int i = 0; i < T * W; i += 7) query[i] *= 0.01f;   /* some gates near 0, where the root is steep */
    float * kd = put(be, key, T * W), * qd = put(be, query, T * W), * vd = put(be, value, T * N);
    float * od = be->ops->alloc(be, sizeof(float) * T * W);
    be->ops->ple_gate(be, od, kd, qd, vd, T, HC, N);
    float * o = get(be, od, T * W);
    double e = 0;
    for (int t = 0; t < T; t++) {
        for (int c = 0; c < HC; c++) {
            double dot = 0;
            for (int j = 0; j < N; j++) dot += (double) key[(t * HC + c) * N + j] * query[(t * HC + c) * N + j];
            const double g = dot / sqrt((double) N), r = (g > 0) - (g < 0), mag = sqrt(fmax(fabs(g), 1e-6));
            const double gate = 1.0 / (1.0 + exp(-r * mag));
            for (int j = 0; j < N; j++) {
                const double ref = gate * value[t * N + j];
                e = fmax(e, fabs(o[(t * HC + c) * N + j] - ref) / (fabs(value[t * N + j]) + 1e-3));
            }
        }
    }
    record(be->ops->name, "ple_gate", "6 tokens of 3 streams", e, 1e-5);

    float * taps = randn(K * W, 0.5f), * x = randn(T * W, 1.0f), * out0 = randn(T * W, 1.0f);
    float * state_a = randn(S * W, 1.0f);
    rm_weight w = {RM_TYPE_F32, {K, W, 1, 1}, (const uint8_t *) taps, sizeof(float) * K};
    const int na = 4, nb = T - na;   /* rows 0..3 sequence a, 4..5 sequence b */
    float * xd = put(be, x, T * W), * yd = put(be, out0, T * W);
    float * sa = put(be, state_a, S * W), * sb = be->ops->alloc(be, sizeof(float) * S * W);
    const rm_ple_conv_seq seqs[2] = {{sa, 0, na}, {sb, na, nb}};
    const rm_ple_conv_args a = {&w, xd, yd, seqs, 2, W, K, D};
    be->ops->ple_conv(be, &a);
    float * y = get(be, yd, T * W), * ga = get(be, sa, S * W), * gb = get(be, sb, S * W);
    double es = 0;
    e = 0;
    for (int q = 0; q < 2; q++) {
        const int row0 = q ? na : 0, n = q ? nb : na;
        for (int c = 0; c < W; c++) {
            double hist[S + T];   /* the sequence's rows of channel c, the state's first */
            for (int i = 0; i < S; i++) hist[i] = q ? 0.0 : state_a[i * W + c];
            for (int t = 0; t < n; t++) hist[S + t] = x[(row0 + t) * W + c];
            for (int t = 0; t < n; t++) {
                double sum = 0;
                for (int j = 0; j < K; j++) sum += (double) taps[c * K + j] * hist[S + t - (K - 1 - j) * D];
                const double ref = out0[(row0 + t) * W + c] + sum / (1.0 + exp(-sum));
                e = fmax(e, fabs(y[(row0 + t) * W + c] - ref) / (fabs(out0[(row0 + t) * W + c]) + fabs(sum) + 1e-3));
            }
            for (int i = 0; i < S; i++) {
                es = fmax(es, fabs((q ? gb : ga)[i * W + c] - hist[n + i]));
            }
        }
    }
    record(be->ops->name, "ple_conv", "2 sequences, one with a state", e, 1e-5);
    record(be->ops->name, "ple_conv", "the states after", es, 0.0);
    /* sequence a again, in steps of 1 and 3 rows: the same floats as in one step */
    be->ops->upload(be, sa, state_a, sizeof(float) * S * W);
    be->ops->upload(be, yd, out0, sizeof(float) * T * W);
    const rm_ple_conv_seq first = {sa, 0, 1}, rest = {sa, 1, na - 1};
    const rm_ple_conv_args a1 = {&w, xd, yd, &first, 1, W, K, D}, a2 = {&w, xd, yd, &rest, 1, W, K, D};
    be->ops->ple_conv(be, &a1);
    be->ops->ple_conv(be, &a2);
    float * y2 = get(be, yd, T * W), * ga2 = get(be, sa, S * W);
    double diff = 0;
    for (int i = 0; i < na * W; i++) diff = fmax(diff, fabs(y2[i] - y[i]));
    for (int i = 0; i < S * W; i++) diff = fmax(diff, fabs(ga2[i] - ga[i]));
    record(be->ops->name, "ple_conv", "steps of 1 and 3 rows as one of 4", diff, 0.0);
    void * dev[] = {kd, qd, vd, od, xd, yd, sa, sb};
    for (size_t i = 0; i < sizeof(dev) / sizeof(dev[0]); i++) be->ops->release(be, dev[i]);
    void * host[] = {key, query, value, o, taps, x, out0, state_a, y, ga, gb, y2, ga2};
    for (size_t i = 0; i < sizeof(host) / sizeof(host[0]); i++) free(host[i]);
}

/* DeepSeek-V4's hyper-connections' weights (transformers' DeepseekV4HyperConnection: sigmoid gates,
 * a row-softmaxed matrix projected by Sinkhorn-Knopp) and the output's (DeepseekV4HyperHead: the
 * gates alone), the streams' weighted sum and a block's output into the streams, against double. */
static void ref_mhc_weights(double * l, const float * scale, const float * base, int hc, int n_mix, int iters,
                            double eps) {
    for (int c = 0; c < hc; c++) l[c] = 1.0 / (1.0 + exp(-(l[c] * scale[0] + base[c]))) + eps;
    if (n_mix == hc) return;
    for (int c = 0; c < hc; c++) l[hc + c] = 2.0 / (1.0 + exp(-(l[hc + c] * scale[1] + base[hc + c])));
    double * m = l + 2 * hc;
    for (int j = 0; j < hc; j++) {
        double mx = -INFINITY, sum = 0;
        for (int k = 0; k < hc; k++) m[j * hc + k] = m[j * hc + k] * scale[2] + base[2 * hc + j * hc + k];
        for (int k = 0; k < hc; k++) mx = fmax(mx, m[j * hc + k]);
        for (int k = 0; k < hc; k++) sum += exp(m[j * hc + k] - mx);
        for (int k = 0; k < hc; k++) m[j * hc + k] = exp(m[j * hc + k] - mx) / sum + eps;
    }
    for (int it = 0; it < iters; it++) {
        for (int pass = it == 0 ? 1 : 0; pass < 2; pass++) {   /* rows (pass 0), then columns (pass 1) */
            for (int a = 0; a < hc; a++) {
                double sum = 0;
                for (int b = 0; b < hc; b++) sum += pass ? m[b * hc + a] : m[a * hc + b];
                for (int b = 0; b < hc; b++) *(pass ? &m[b * hc + a] : &m[a * hc + b]) /= sum + eps;
            }
        }
    }
}

static void test_mhc_ops(rm_backend * be) {
    if (!be->ops->mhc_weights) return;
    enum { HC = 4, N = 40, T = 5, MIX = (2 + HC) * HC, ITERS = 20 };
    const float eps = 1e-6f;
    float * lg = randn(T * MIX, 2.0f), * sc = randn(3, 1.0f), * bs = randn(MIX, 1.0f);
    float * h = randn(T * HC * N, 1.5f), * b = randn(T * N, 1.0f);
    rm_weight scale = {RM_TYPE_F32, {3, 1, 1, 1}, (const uint8_t *) sc, sizeof(float) * 3};
    rm_weight base = {RM_TYPE_F32, {MIX, 1, 1, 1}, (const uint8_t *) bs, sizeof(float) * MIX};
    float * md = put(be, lg, T * MIX);
    be->ops->mhc_weights(be, md, &scale, &base, T, HC, MIX, ITERS, eps);
    float * mix = get(be, md, T * MIX);
    double ref[T * MIX], e = 0, e_sum = 0;
    for (int i = 0; i < T * MIX; i++) ref[i] = lg[i];
    for (int t = 0; t < T; t++) {
        ref_mhc_weights(ref + t * MIX, sc, bs, HC, MIX, ITERS, eps);
        for (int k = 0; k < HC; k++) {   /* comb's columns sum to about 1 (the last normalisation) */
            double col = 0;
            for (int j = 0; j < HC; j++) col += mix[t * MIX + 2 * HC + j * HC + k];
            e_sum = fmax(e_sum, fabs(col - 1.0));
        }
    }
    for (int i = 0; i < T * MIX; i++) e = fmax(e, fabs(mix[i] - ref[i]) / (fabs(ref[i]) + 1e-3));
    record(be->ops->name, "mhc_weights", "5 tokens of 4 streams, 20 Sinkhorn rounds", e, 1e-5);
    record(be->ops->name, "mhc_weights", "comb's columns sum to 1", e_sum, 1e-4);
    /* the output's: 4 gates from 4 logits, one scale */
    float * lh = randn(T * HC, 2.0f);
    float * hd = put(be, lh, T * HC);
    be->ops->mhc_weights(be, hd, &scale, &base, T, HC, HC, ITERS, eps);
    float * pre = get(be, hd, T * HC);
    e = 0;
    for (int i = 0; i < T * HC; i++) {
        const double r = 1.0 / (1.0 + exp(-((double) lh[i] * sc[0] + bs[i % HC]))) + eps;
        e = fmax(e, fabs(pre[i] - r) / fabs(r));
    }
    record(be->ops->name, "mhc_weights", "the output's gates", e, 1e-6);
    /* the weighted sum, over the block's weights (mix rows, pre their first HC) */
    float * xd = put(be, h, T * HC * N), * yd = be->ops->alloc(be, sizeof(float) * T * N);
    be->ops->mhc_collapse(be, yd, xd, md, MIX, T, HC, N);
    float * y = get(be, yd, T * N);
    e = 0;
    for (int t = 0; t < T; t++) {
        for (int d = 0; d < N; d++) {
            double r = 0, mag = 0;
            for (int c = 0; c < HC; c++) {
                r += ref[t * MIX + c] * h[(t * HC + c) * N + d];
                mag += fabs(ref[t * MIX + c] * h[(t * HC + c) * N + d]);
            }
            e = fmax(e, fabs(y[t * N + d] - r) / (mag + 1e-3));
        }
    }
    record(be->ops->name, "mhc_collapse", "5 tokens of 4 streams", e, 1e-5);
    float * bd = put(be, b, T * N);
    be->ops->mhc_expand(be, xd, bd, md, T, HC, N);
    float * h2 = get(be, xd, T * HC * N);
    e = 0;
    for (int t = 0; t < T; t++) {
        const double * post = ref + t * MIX + HC, * comb = post + HC;
        for (int k = 0; k < HC; k++) {
            for (int d = 0; d < N; d++) {
                double r = post[k] * b[t * N + d], mag = fabs(r);
                for (int j = 0; j < HC; j++) {
                    r += comb[j * HC + k] * h[(t * HC + j) * N + d];
                    mag += fabs(comb[j * HC + k] * h[(t * HC + j) * N + d]);
                }
                e = fmax(e, fabs(h2[(t * HC + k) * N + d] - r) / (mag + 1e-3));
            }
        }
    }
    record(be->ops->name, "mhc_expand", "5 tokens of 4 streams, in place", e, 1e-5);
    be->ops->release(be, md), be->ops->release(be, hd), be->ops->release(be, xd), be->ops->release(be, yd);
    be->ops->release(be, bd);
    free(lg), free(sc), free(bs), free(h), free(b), free(mix), free(lh), free(pre), free(y), free(h2);
}

/* DeepSeek-V4's compressor (transformers' DeepseekV4HCACompressor and DeepseekV4CSACompressor)
 * against double: windows of 4 (with the previous window's first half of the columns: CSA's, also
 * for the first window from the state of a previous call, and without one) and of 8 (HCA's). */
static void ref_compress(const rm_compress_args * a, const float * ape, const float * nw, double * out) {
    const int D = a->head_dim, R = a->ratio, W = a->overlap ? 2 * D : D, off = a->overlap ? D : 0;
    for (int w = 0; w < a->n_win; w++) {
        const float * kv = a->kv + w * R * W, * g = a->gate + w * R * W;
        const float * pkv = w ? kv - R * W : a->prev_kv, * pg = w ? g - R * W : a->prev_gate;
        const int prev = a->overlap && pkv;
        double * e = out + w * D, ss = 0;
        for (int d = 0; d < D; d++) {
            double z[64], c[64];
            int n = 0;
            for (int j = 0; j < R && prev; j++, n++) z[n] = (double) pg[j * W + d] + ape[j * W + d], c[n] = pkv[j * W + d];
            for (int j = 0; j < R; j++, n++) z[n] = (double) g[j * W + off + d] + ape[j * W + off + d], c[n] = kv[j * W + off + d];
            double mx = -INFINITY, sum = 0, acc = 0;
            for (int j = 0; j < n; j++) mx = fmax(mx, z[j]);
            for (int j = 0; j < n; j++) sum += exp(z[j] - mx), acc += exp(z[j] - mx) * c[j];
            e[d] = acc / sum;
            ss += e[d] * e[d];
        }
        for (int d = 0; d < D; d++) e[d] = e[d] / sqrt(ss / D + a->eps) * nw[d];
        const int pos = a->pos0 + w * R, o = D - a->n_rot;
        for (int i = 0; i < a->n_rot / 2; i++) {
            const double ang = pos * pow(a->rope_base, -2.0 * i / a->n_rot), x0 = e[o + 2 * i], x1 = e[o + 2 * i + 1];
            e[o + 2 * i] = x0 * cos(ang) - x1 * sin(ang);
            e[o + 2 * i + 1] = x0 * sin(ang) + x1 * cos(ang);
        }
    }
}

static void test_compress_case(rm_backend * be, int overlap, int ratio, int with_prev, int pos0, const char * what) {
    enum { D = 32, NW = 3, ROT = 8 };
    const int W = overlap ? 2 * D : D;
    float * kv = randn(NW * ratio * W, 1.0f), * g = randn(NW * ratio * W, 2.0f), * pkv = randn(ratio * W, 1.0f);
    float * pg = randn(ratio * W, 2.0f), * apev = randn(ratio * W, 1.0f), * nw = randn(D, 1.0f);
    rm_weight ape = {RM_TYPE_F32, {W, ratio, 1, 1}, (const uint8_t *) apev, sizeof(float) * (uint64_t) W};
    rm_weight norm = {RM_TYPE_F32, {D, 1, 1, 1}, (const uint8_t *) nw, sizeof(float) * D};
    float * kvd = put(be, kv, NW * ratio * W), * gd = put(be, g, NW * ratio * W);
    float * pkvd = put(be, pkv, ratio * W), * pgd = put(be, pg, ratio * W);
    float * od = be->ops->alloc(be, sizeof(float) * NW * D);
    rm_compress_args a = {od, kvd, gd, with_prev ? pkvd : NULL, with_prev ? pgd : NULL, &ape, &norm, NW, ratio, D, overlap,
                          ROT, pos0, 160000.0f, 1e-6f};
    be->ops->compress(be, &a);
    float * out = get(be, od, NW * D);
    a.kv = kv, a.gate = g, a.prev_kv = with_prev ? pkv : NULL, a.prev_gate = with_prev ? pg : NULL;
    double ref[NW * D], e = 0;
    ref_compress(&a, apev, nw, ref);
    for (int i = 0; i < NW * D; i++) e = fmax(e, fabs(out[i] - ref[i]) / (fabs(ref[i]) + 1e-2));
    record(be->ops->name, "compress", what, e, 2e-4);
    be->ops->release(be, kvd), be->ops->release(be, gd), be->ops->release(be, pkvd), be->ops->release(be, pgd);
    be->ops->release(be, od);
    free(kv), free(g), free(pkv), free(pg), free(apev), free(nw), free(out);
}

static void test_compress_ops(rm_backend * be) {
    if (!be->ops->compress) return;
    test_compress_case(be, 1, 4, 0, 0, "CSA: 3 windows of 4, the first alone");
    test_compress_case(be, 1, 4, 1, 1000, "CSA: 3 windows of 4 at 1000, after a previous window");
    test_compress_case(be, 0, 8, 1, 1024, "HCA: 3 windows of 8 at 1024 (no overlap: prev unused)");
}

/* DeepSeek-V4's CSA pick (transformers' DeepseekV4Indexer) against double scores: 6 tokens at
 * positions 40.. (10 or 11 entries of 4 positions each, 4 kept) and 3 at positions 5.. (1 or 2
 * entries: all kept, the row's rest -1). Random floats have no ties: the picked sets must be equal. */
static void test_csa_case(rm_backend * be, int n_tok, int pos0) {
    enum { H = 3, D = 16, R = 4, K = 4, NE = 12 };
    float * q = randn(n_tok * H * D, 1.0f), * w = randn(n_tok * H, 1.0f), * keys = randn(NE * D, 1.0f);
    float scratch[2 * 2 * (NE + 1) * 4];
    EXPECT(rm_csa_host_floats(R, pos0 + n_tok, 4) <= sizeof(scratch) / sizeof(float), "csa scratch");
    int32_t sel[16 * K];
    rm_csa_args a = {q, w, keys, n_tok, pos0, H, D, R, K, sel, scratch};
    be->ops->csa_select(be, &a);
    int mismatched = 0;
    for (int i = 0; i < n_tok; i++) {
        const int nb = (pos0 + i + 1) / R;
        double sc[NE];
        for (int s2 = 0; s2 < nb; s2++) {
            sc[s2] = 0;
            for (int h = 0; h < H; h++) {
                double dot = 0;
                for (int d = 0; d < D; d++) dot += (double) q[(i * H + h) * D + d] * keys[s2 * D + d];
                sc[s2] += fmax(dot, 0.0) / sqrt((double) D) * w[i * H + h] / sqrt((double) H);
            }
        }
        uint8_t kept[NE] = {0};
        for (int k = 0; k < K && k < nb; k++) {
            int best = -1;
            for (int s2 = 0; s2 < nb; s2++) if (!kept[s2] && (best < 0 || sc[s2] > sc[best])) best = s2;
            kept[best] = 1;
        }
        int j = 0;
        for (int s2 = 0; s2 < nb; s2++) if (kept[s2]) mismatched += sel[i * K + j++] != s2;
        for (; j < K; j++) mismatched += sel[i * K + j] != -1;
    }
    char what[64];
    snprintf(what, sizeof(what), "%d tokens at %d: the picks", n_tok, pos0);
    record(be->ops->name, "csa_select", what, (double) mismatched, 0.0);
    free(q), free(w), free(keys);
}

static void test_csa_ops(rm_backend * be) {
    if (!be->ops->csa_select) return;
    test_csa_case(be, 6, 40);
    test_csa_case(be, 3, 5);
}

/* DeepSeek-V4's attention core against double: a window of 8 over a ring of 13 rows, alone, with
 * every entry of 8 positions a token sees (HCA's), and with the entries a pick names (CSA's, rows
 * ended by -1); sinks per head. */
static void test_dsv4_attn_case(rm_backend * be, int kind, const char * what) {
    enum { H = 3, D = 16, T = 5, P0 = 20, W = 8, RING = 13, NE = 4, K = 3 };
    const int R = kind == 2 ? 4 : 8;
    float * q = randn(T * H * D, 0.5f), * keys = randn((P0 + T) * D, 1.0f), * ent = randn(NE * D, 1.0f);
    float * sinks = randn(H, 1.0f), ring[RING * D], out[T * H * D], scratch[4 * 4 * (W + 32)];
    for (int j = P0 + T - RING; j < P0 + T; j++) memcpy(ring + (j % RING) * D, keys + j * D, sizeof(float) * D);
    const int32_t sel[T * K] = {1, 3, -1, 0, 2, 4, 4, -1, -1, 0, 1, 5, 2, 3, 5};   /* tokens at 20..24 see 5 or 6 */
    EXPECT(rm_dsv4_attn_host_floats(W, R, P0 + T, 4) <= sizeof(scratch) / sizeof(float), "dsv4 scratch");
    float * ent6 = randn(6 * D, 1.0f);
    rm_dsv4_attn_args a = {out, q, ring, RING, kind == 0 ? NULL : kind == 1 ? ent : ent6, R, kind == 2 ? sel : NULL, K,
                           sinks, T, P0, H, D, W, 0.25f, scratch};
    be->ops->dsv4_attention(be, &a);
    double e = 0;
    for (int i = 0; i < T; i++) {
        const int p = P0 + i;
        for (int h = 0; h < H; h++) {
            const float * qh = q + (i * H + h) * D;
            const float * v[W + 8];
            int n = 0;
            for (int j = p - W + 1; j <= p; j++) v[n++] = keys + j * D;
            if (kind == 1) for (int s2 = 0; s2 < (p + 1) / R && s2 < NE; s2++) v[n++] = ent + s2 * D;
            if (kind == 2) for (int k = 0; k < K && sel[i * K + k] >= 0; k++) v[n++] = ent6 + sel[i * K + k] * D;
            double lg[W + 8], mx = sinks[h], sum, o[D] = {0}, mag = 0;
            for (int j = 0; j < n; j++) {
                lg[j] = 0;
                for (int d = 0; d < D; d++) lg[j] += (double) qh[d] * v[j][d];
                lg[j] *= 0.25;
                mx = fmax(mx, lg[j]);
            }
            sum = exp(sinks[h] - mx);
            for (int j = 0; j < n; j++) sum += exp(lg[j] - mx);
            for (int j = 0; j < n; j++)
                for (int d = 0; d < D; d++) o[d] += exp(lg[j] - mx) / sum * v[j][d];
            for (int d = 0; d < D; d++) mag = fmax(mag, fabs(o[d]));
            for (int d = 0; d < D; d++) e = fmax(e, fabs(out[(i * H + h) * D + d] - o[d]) / (mag + 1e-3));
        }
    }
    record(be->ops->name, "dsv4_attention", what, e, 1e-5);
    free(q), free(keys), free(ent), free(ent6), free(sinks);
}

static void test_dsv4_attn_ops(rm_backend * be) {
    if (!be->ops->dsv4_attention) return;
    test_dsv4_attn_case(be, 0, "a window of 8 on a ring of 13, sinks");
    test_dsv4_attn_case(be, 1, "and every entry of 8 positions seen");
    test_dsv4_attn_case(be, 2, "and the picked entries of 4 positions");
}

static void test_dsa_ops(rm_backend * be) {
    if (!be->ops->dsa_select || !be->ops->layernorm) return;
    enum { N = 40, R = 3, HI = 4, DI = 32, LAT = 64, W = LAT + DI, K = 10, CTX = 300, T = 6 };
    float * x = randn(R * N, 1.5f), * wv = randn(N, 1.0f), * bv = randn(N, 0.5f);
    rm_weight w = {RM_TYPE_F32, {N, 1, 1, 1}, (const uint8_t *) wv, sizeof(float) * N};
    rm_weight b = {RM_TYPE_F32, {N, 1, 1, 1}, (const uint8_t *) bv, sizeof(float) * N};
    float * xd = put(be, x, R * N), * yd = put(be, x, R * N);
    be->ops->layernorm(be, yd, xd, &w, &b, R, N, 1e-6f);
    float * y = get(be, yd, R * N);
    double e = 0;
    for (int r = 0; r < R; r++) {
        double mean = 0, var = 0;
        for (int j = 0; j < N; j++) mean += x[r * N + j] / (double) N;
        for (int j = 0; j < N; j++) var += (x[r * N + j] - mean) * (x[r * N + j] - mean) / (double) N;
        for (int j = 0; j < N; j++) {
            const double ref = (x[r * N + j] - mean) / sqrt(var + 1e-6) * wv[j] + bv[j];
            e = fmax(e, fabs(y[r * N + j] - ref) / (fabs(ref) + 1e-3));
        }
    }
    record(be->ops->name, "layernorm", "3 rows with a bias", e, 1e-5);
    free(y);
    for (int f16 = 0; f16 < 2; f16++) {
        const int32_t type = f16 ? RM_TYPE_F16 : RM_TYPE_F32;
        const rm_type_traits * tt = rm_type_traits_get(type);
        const uint64_t row_bytes = (uint64_t) (W / tt->block_elems) * tt->block_bytes;
        float * rows = randn((int64_t) CTX * W, 1.0f), * keys = malloc(sizeof(float) * CTX * DI);
        uint8_t * cache = malloc(row_bytes * CTX);
        for (int j = 0; j < CTX; j++) {
            tt->from_float(rows + (int64_t) j * W, cache + (uint64_t) j * row_bytes, W);
            tt->to_float(cache + (uint64_t) j * row_bytes + row_bytes / W * LAT, keys + (int64_t) j * DI, DI);
        }
        float * q = randn(T * HI * DI, 1.0f), * wh = randn(T * HI, 1.0f);
        float * qd = put(be, q, T * HI * DI), * whd = put(be, wh, T * HI);
        int32_t sel[T * K];
        for (int i = 0; i < T * K; i++) sel[i] = -7;
        const rm_mla_seq seqs[2] = {{cache, 0, 5, 295}, {cache, 5, 1, 9}};
        float * scratch = malloc(sizeof(float) * (2 * CTX + 64 * 64 * (DI + 1)));
        const rm_dsa_args a = {qd, whd, seqs, 2, HI, DI, K, type, row_bytes, row_bytes / W * LAT, CTX, sel, scratch};
        be->ops->dsa_select(be, &a);
        int wrong = 0;
        for (int t = 0; t < 5; t++) {
            const int n = 295 + t + 1;
            double sc[CTX];
            for (int j = 0; j < n; j++) {
                sc[j] = 0;
                for (int h = 0; h < HI; h++) {
                    double d = 0;
                    for (int c = 0; c < DI; c++) d += (double) q[(t * HI + h) * DI + c] * keys[j * DI + c];
                    sc[j] += wh[t * HI + h] * (d > 0 ? d : 0);
                }
            }
            for (int m = 0; m < K; m++) {   /* each picked one beats every position left out, in ascending order */
                const int32_t pj = sel[t * K + m];
                wrong += pj < 0 || pj >= n || (m > 0 && pj <= sel[t * K + m - 1]);
                if (pj < 0 || pj >= n) continue;
                int better = 0;
                for (int j = 0; j < n; j++) better += sc[j] > sc[pj];
                wrong += better >= K;
            }
        }
        for (int m = 0; m < K; m++) wrong += sel[5 * K + m] != -7;
        record(be->ops->name, "dsa_select", f16 ? "F16 rows" : "F32 rows", (double) wrong, 0.0);
        free(rows), free(keys), free(cache), free(scratch), free(q), free(wh);
        be->ops->release(be, qd), be->ops->release(be, whd);
    }
    free(x), free(wv), free(bv);
    be->ops->release(be, xd), be->ops->release(be, yd);
}

/* QSA's pick against a double-precision reference: each token's blocks' keys (the mean of their raw
 * keys, RMS-normed, RoPE'd NEOX on the first ROT dims at the block's first position) and scores
 * sum_h relu(q_h . K_b) / sqrt(DI); every picked block must beat all but fewer than K of the others,
 * in ascending order, and the rows of tokens that keep every block stay untouched. */
static void test_qsa_ops(rm_backend * be) {
    if (!be->ops->qsa_select) return;
    enum { HI = 3, DI = 16, ROT = 8, RATIO = 4, K = 2, CTX = 120, T = 7, POS0 = 6 };
    float * keys = randn(CTX * DI, 1.0f), * q = randn(T * HI * DI, 1.0f), * nw = randn(DI, 0.3f);
    for (int c = 0; c < DI; c++) nw[c] += 1.0f;
    rm_weight w = {RM_TYPE_F32, {DI, 1, 1, 1}, (const uint8_t *) nw, sizeof(float) * DI};
    float * kd = put(be, keys, CTX * DI), * qd = put(be, q, T * HI * DI);
    int32_t sel[T * K];
    for (int i = 0; i < T * K; i++) sel[i] = -7;
    float * scratch = malloc(sizeof(float) * rm_qsa_host_floats(DI, RATIO, CTX, 2));
    for (int step = 0; step < 2; step++) {   /* a prefill from POS0, then one token far on */
        const int32_t pos0 = step ? 101 : POS0, n_tok = step ? 1 : T;
        for (int i = 0; i < T * K; i++) sel[i] = -7;
        const rm_qsa_args a = {qd, kd, &w, n_tok, pos0, HI, DI, ROT, RATIO, K, 1e-6f, 10000.0f, 1, sel, scratch};
        be->ops->qsa_select(be, &a);
        int wrong = 0;
        for (int t = 0; t < n_tok; t++) {
            const int nb = (pos0 + t + 1) / RATIO;
            if (nb <= K) {   /* keeps every block: its row untouched */
                for (int m = 0; m < K; m++) wrong += sel[t * K + m] != -7;
                continue;
            }
            double sc[CTX];
            for (int b = 0; b < nb; b++) {
                double kb[DI], ss = 0;
                for (int c = 0; c < DI; c++) {
                    kb[c] = 0;
                    for (int j = 0; j < RATIO; j++) kb[c] += keys[(b * RATIO + j) * DI + c] / (double) RATIO;
                    ss += kb[c] * kb[c] / DI;
                }
                for (int c = 0; c < DI; c++) kb[c] = kb[c] / sqrt(ss + 1e-6) * nw[c];
                for (int i = 0; i < ROT / 2; i++) {
                    const double ang = (double) b * RATIO * pow(10000.0, -2.0 * i / ROT);
                    const double x0 = kb[i], x1 = kb[i + ROT / 2];
                    kb[i] = x0 * cos(ang) - x1 * sin(ang);
                    kb[i + ROT / 2] = x0 * sin(ang) + x1 * cos(ang);
                }
                sc[b] = 0;
                for (int h = 0; h < HI; h++) {
                    double d = 0;
                    for (int c = 0; c < DI; c++) d += (double) q[(t * HI + h) * DI + c] * kb[c];
                    sc[b] += d > 0 ? d : 0;
                }
                sc[b] /= sqrt((double) DI);
            }
            for (int m = 0; m < K; m++) {
                const int32_t pb = sel[t * K + m];
                wrong += pb < 0 || pb >= nb || (m > 0 && pb <= sel[t * K + m - 1]);
                if (pb < 0 || pb >= nb) continue;
                int better = 0;
                for (int b = 0; b < nb; b++) better += sc[b] > sc[pb] + 1e-9;
                wrong += better >= K;
            }
        }
        record(be->ops->name, "qsa_select", step ? "a token at 101" : "7 tokens from 6", (double) wrong, 0.0);
    }
    free(keys), free(q), free(nw), free(scratch);
    be->ops->release(be, kd), be->ops->release(be, qd);
}

/* ---- per backend ---------------------------------------------------------------------------- */

static void test_backend(rm_backend * be, const rm_model * m, int32_t type, int half_on_host) {
    const int quantized = type != RM_TYPE_F32 && type != RM_TYPE_F16;
    const double tol = strcmp(be->ops->name, "cpu") == 0 && quantized ? 1e-2 : 2e-5;
    const rm_layer * L = &m->layers[0];
    rm_type_info ti;
    rm_type_describe(type, &ti);
    char label[64];
    snprintf(label, sizeof(label), "%s wq", ti.name);
    test_matmul(be, &L->wq, 0, label, tol);
    snprintf(label, sizeof(label), "%s gate_exps[2]", ti.name);
    test_matmul(be, &L->gate_exps, 2, label, tol);
    snprintf(label, sizeof(label), "%s down_exps[%d]%s", ti.name, half_on_host ? 1 : 0,
             half_on_host ? " (in host memory)" : "");
    test_matmul(be, &L->down_exps, half_on_host ? 1 : 0, label, tol);
    snprintf(label, sizeof(label), "%s experts", ti.name);
    test_matmul_many(be, m, label);
    EXPECT(be->ops->status(be) == RM_OK, "%s: backend status after the matmuls: %s", be->ops->name, rm_last_error());
}

static rm_model * load(const char * path, int use_gpu, int half) {
    rm_model_params p = {0};
    p.struct_size = sizeof(p);
    p.n_threads = 2;
    p.use_gpu = use_gpu;
    uint8_t mask[2 * 8];
    for (int i = 0; i < 16; i++) mask[i] = (uint8_t) (i % 2 == 0);
    p.expert_on_gpu = half ? mask : NULL;
    rm_model * m = NULL;
    if (rm_model_load(path, &p, &m) != RM_OK) {
        printf("load %s: %s\n", path, rm_last_error());
        return NULL;
    }
    return m;
}

int main(int argc, char ** argv) {
    const char * json_path = argc == 3 && !strcmp(argv[1], "--json") ? argv[2] : NULL;
    char dir[] = "/tmp/rm_backend_ops_XXXXXX";
    if (!mkdtemp(dir)) return 1;
    printf("%s\n", rm_build_info());
    JSON("[");
    const int32_t types[] = {RM_TYPE_F32, RM_TYPE_F16, RM_TYPE_Q4_0, RM_TYPE_Q8_0, RM_TYPE_Q2_K, RM_TYPE_Q3_K, RM_TYPE_Q4_K,
                             RM_TYPE_Q5_K, RM_TYPE_Q6_K};
    int gpu_ok = 0;
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
        tiny_spec s = tiny_default(i == 0 ? "qwen2moe" : "qwen3moe");
        s.dense_type = s.expert_type = s.output_type = types[i];
        s.residual_type = -1;
        s.seed = 10 + i;
        char path[256];
        snprintf(path, sizeof(path), "%s/m%zu.gguf", dir, i);
        EXPECT(tiny_write(&s, path, NULL) == 0, "writing the type-%d model", types[i]);
        rm_model * m = load(path, 0, 0);
        if (!m) { ++n_failed; continue; }
        rm_backend * cpu = rm_backend_cpu_new(m->pool, 32, 1024, 64);
        test_backend(cpu, m, types[i], 0);
        if (i == 0) {
            test_rows_and_adds(cpu, m);
            test_rope(cpu);
            test_route(cpu);
            test_attention_small(cpu, m);
            test_dequantize_equal();
            for (int n_tok = 1; n_tok <= 27; n_tok += 26) {   /* CPU only: contexts past the backends' n_ctx of 64 */
                test_attention_case(cpu, m, n_tok, 230, 128, 0, 0, 16, 2);
                test_attention_case(cpu, m, n_tok, 230, 128, 100, 0, 16, 2);
                test_attention_case(cpu, m, n_tok, 230, 128, 100, 170, 16, 2);
            }
            test_attention_case(cpu, m, 6, 230, 128, 0, 0, 16, 2);
            test_attention_case(cpu, m, 1, 230, 128, 0, 0, 64, 1);   /* a group above the rows a job holds */
            test_attention_case(cpu, m, 3, 230, 128, 0, 0, 64, 1);
            /* segments of 512 positions: one token's split by them (merged at the end), several
             * tokens' each merged in its job; a window with sinks, a ring, values narrower */
            for (int n_tok = 1; n_tok <= 5; n_tok += 4) {
                test_attention_case(cpu, m, n_tok, 1400, 64, 0, 0, 8, 2);
                test_attention_case(cpu, m, n_tok, 1400, 64, 700, 0, 8, 2);
                test_attention_case(cpu, m, n_tok, 1400, 64, 600, 650, 8, 4);
                test_attention_full(cpu, m, n_tok, 1100, 192, 128, 0, 0, 16, 2, 0.0f);
                /* multi-head latent attention's absorbed form: one kv head of latent rows, the
                 * values their first floats (the keys' row stride) */
                test_attention_any(cpu, m, n_tok, 1100, 72, 56, 0, 0, 16, 1, 0.1f, 1);
            }
            test_attention_any(cpu, m, 1, 40, 72, 56, 0, 0, 16, 1, 0.0f, 1);   /* one segment: heads split */
            test_attention_split_equal(cpu, m, 0, 0);
            test_attention_split_equal(cpu, m, 900, 1000);
            test_gpt_oss_ops(cpu);
            test_gemma4_ops(cpu, m);
            test_dsa_ops(cpu);
            test_qsa_ops(cpu);
            test_hc_ops(cpu);
            test_ple_ops(cpu);
            test_mhc_ops(cpu);
            test_compress_ops(cpu);
            test_route_dsv4(cpu);
            test_csa_ops(cpu);
            test_dsv4_attn_ops(cpu);
        }
        cpu->ops->free(cpu);
        rm_model_free(m);
#ifdef RM_WITH_CUDA
        for (int half = 0; half < 2; half++) {
            rm_model * mg = load(path, 1, half);
            if (!mg) { ++n_failed; continue; }
            if (mg->device != &rm_device_cuda) {
                if (i == 0 && !half) printf("skip the CUDA backend: %s\n", mg->gpu_info.note);
                rm_model_free(mg);
                break;
            }
            gpu_ok = 1;
            rm_status st;
            rm_backend * gpu = mg->device->backend_new(mg->device_state, mg, 32, 1024, 64, &st);
            EXPECT(gpu != NULL, "the CUDA backend: %s", rm_last_error());
            if (gpu) {
                test_backend(gpu, mg, types[i], half);
                if (i == 0 && !half) {
                    test_rows_and_adds(gpu, mg);
                    test_rope(gpu);
                    test_route(gpu);
                    test_attention_small(gpu, mg);
                    test_gpt_oss_ops(gpu);
                    test_gemma4_ops(gpu, mg);
                }
                EXPECT(gpu->ops->status(gpu) == RM_OK, "CUDA backend status: %s", rm_last_error());
                gpu->ops->free(gpu);
            }
            rm_model_free(mg);
        }
#endif
    }
    JSON("]\n");
    if (json_path) {
        FILE * f = fopen(json_path, "w");
        if (f) fputs(json, f), fclose(f);
    }
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    if (system(cmd) != 0) printf("could not remove %s\n", dir);
    printf("test_backend_ops: %d passed, %d failed%s\n", n_passed, n_failed,
           gpu_ok ? "" : " (no GPU: the CPU backend only)");
    return n_failed ? 1 : 0;
}
