/* test_backend_gdn.c - the Gated DeltaNet kernels (cpu/gdn.c) on random inputs (never zeros),
 * against a double-precision delta rule written here from its definition:
 *
 *   delta rule vs reference       1e-5 of max |o|, and the state within 1e-5 of max |S| (the
 *                                 chunk-start state advanced over the unfinished chunk's rows), for
 *                                 lengths that end inside, at and past a chunk boundary, from a
 *                                 position inside a chunk
 *   delta rule in pieces          the same tokens in one call, one token a call and cut at
 *                                 uneven places: bit for bit the same outputs and state, for the
 *                                 twin and every instruction set (a sequence's floats do not
 *                                 depend on how a batch cut it)
 *   convolution                   split into calls of 1, 2 and 5 tokens vs one call: equal within
 *                                 1e-6 (the rolling state carries the history), vs reference 1e-6
 *   gated norm                    1e-5 relative
 *   each instruction set's delta rule and conv (cpu/gdn_x86.h) vs their scalar twins: outputs
 *                                 and states within 1e-5 of their max (fused multiply-adds round
 *                                 differently), over shapes that take the vector path and ones
 *                                 that fall back to the twin */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/dispatch.h"
#include "cpu/gdn.h"
#include "tiny_gguf.h"
#include "expect.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;

static float * randn(int64_t n, float scale) {
    float * x = malloc(sizeof(float) * (size_t) n);
    for (int64_t i = 0; i < n; i++) {
        x[i] = scale * tiny_gauss(&rng);
        if (x[i] == 0.0f) x[i] = scale * 1e-3f;
    }
    return x;
}

/* the delta rule in doubles, token by token, from the definition in gdn.h */
static void reference(const rm_gdn_head * h, double * S, double * o) {
    const int dk = h->d_k, dv = h->d_v;
    double * u = malloc(sizeof(double) * (size_t) dv);
    for (int t = 0; t < h->n_tok; t++) {
        const float * q = h->q + t * h->qk_stride, * k = h->k + t * h->qk_stride, * v = h->v + t * h->v_stride;
        const double decay = exp((double) h->g[t * h->gb_stride]), beta = h->beta[t * h->gb_stride];
        for (int i = 0; i < dk * dv; i++) S[i] *= decay;
        for (int j = 0; j < dv; j++) {
            double sk = 0.0;
            for (int i = 0; i < dk; i++) sk += S[i * dv + j] * k[i];
            u[j] = beta * (v[j] - sk);
        }
        for (int i = 0; i < dk; i++)
            for (int j = 0; j < dv; j++) S[i * dv + j] += k[i] * u[j];
        for (int j = 0; j < dv; j++) {
            double acc = 0.0;
            for (int i = 0; i < dk; i++) acc += S[i * dv + j] * q[i];
            o[t * dv + j] = acc;
        }
    }
    free(u);
}

static double max_abs_d(const double * x, int64_t n) {
    double m = 0.0;
    for (int64_t i = 0; i < n; i++) m = fabs(x[i]) > m ? fabs(x[i]) : m;
    return m;
}

/* n_tok random tokens of one head: q and k unit (q scaled), decays in (0, 0.95), beta in (0, 1). */
typedef struct tokens {
    float * q, * k, * v, * g, * beta;
} tokens;

static tokens random_tokens(int n_tok, int dk, int dv) {
    tokens x = {randn((int64_t) n_tok * dk, 1.0f), randn((int64_t) n_tok * dk, 1.0f), randn((int64_t) n_tok * dv, 1.0f),
                randn(n_tok, 1.0f), randn(n_tok, 1.0f)};
    rm_gdn_l2norm(x.q, n_tok, dk, dk, 1e-6f, 1.0f / sqrtf((float) dk));
    rm_gdn_l2norm(x.k, n_tok, dk, dk, 1e-6f, 1.0f);
    for (int t = 0; t < n_tok; t++) {
        x.g[t] = -0.05f - 0.5f * fabsf(x.g[t]);
        x.beta[t] = 1.0f / (1.0f + expf(-x.beta[t]));
    }
    return x;
}

static void free_tokens(tokens * x) {
    free(x->q), free(x->k), free(x->v), free(x->g), free(x->beta);
}

/* The head of tokens [t0, t0 + n) of x, outputs into o (rows of dv). */
static rm_gdn_head head_of(const tokens * x, int t0, int n, int dk, int dv, float * o) {
    rm_gdn_head h = {x->q + (int64_t) t0 * dk, x->k + (int64_t) t0 * dk, dk, x->v + (int64_t) t0 * dv, dv,
                     x->g + t0, x->beta + t0, 1, o + (int64_t) t0 * dv, dv, n, dk, dv};
    return h;
}

/* The state a head holds at position pos0 after the tokens w (pos0 % C of them, the unfinished
 * chunk's rows) from chunk-start state S0, as the reference needs it: S0 advanced over them. */
static void advance_reference(const tokens * w, int n, int dk, int dv, const float * S0, double * Sd) {
    for (int64_t i = 0; i < (int64_t) dk * dv; i++) Sd[i] = S0[i];
    double * od = malloc(sizeof(double) * (size_t) (n > 0 ? n : 1) * dv);
    const rm_gdn_head h = head_of(w, 0, n, dk, dv, NULL);
    reference(&h, Sd, od);
    free(od);
}

/* Tokens at positions pos0 .. pos0 + n_tok - 1, the first pos0 % C of their chunk given before:
 * rm_gdn_rule against the reference, and the state it leaves against the reference's. */
static void test_delta_rule(int pos0, int n_tok, int dk, int dv) {
    const int C = RM_GDN_CHUNK, p = pos0 % C;
    tokens pre = random_tokens(p, dk, dv), x = random_tokens(n_tok, dk, dv);
    const int64_t ns = (int64_t) dk * dv, nst = rm_gdn_state_floats(dk, dv);
    float * st = calloc((size_t) nst, sizeof(float)), * S0 = randn(ns, 0.3f);   /* a state left by earlier chunks */
    memcpy(st, S0, sizeof(float) * (size_t) ns);
    float * scratch = malloc(sizeof(float) * (size_t) rm_gdn_chunk_scratch(dk, dv));
    float * opre = calloc((size_t) (p + 1) * dv, sizeof(float)), * oc = calloc((size_t) n_tok * dv, sizeof(float));
    rm_gdn_head h = head_of(&pre, 0, p, dk, dv, opre);
    rm_gdn_rule(&h, pos0 - p, st, scratch);          /* the chunk's first rows, then the tokens */
    h = head_of(&x, 0, n_tok, dk, dv, oc);
    rm_gdn_rule(&h, pos0, st, scratch);
    double * Sd = malloc(sizeof(double) * (size_t) ns), * od = malloc(sizeof(double) * (size_t) n_tok * dv);
    advance_reference(&pre, p, dk, dv, S0, Sd);
    h = head_of(&x, 0, n_tok, dk, dv, NULL);
    reference(&h, Sd, od);
    /* the state the rule holds: its chunk-start state advanced over its unfinished chunk's rows */
    const int end = pos0 + n_tok, rows = end % C;
    double * Sr = malloc(sizeof(double) * (size_t) ns);
    if (rows == 0) {
        for (int64_t i = 0; i < ns; i++) Sr[i] = st[i];
    } else {   /* the last rows' tokens: the tail of pre then x, or of x alone */
        const int from_x = rows <= n_tok ? rows : n_tok, from_pre = rows - from_x;
        tokens tail = {0};
        const int n = from_pre + from_x;
        tail.q = malloc(sizeof(float) * (size_t) n * dk), tail.k = malloc(sizeof(float) * (size_t) n * dk);
        tail.v = malloc(sizeof(float) * (size_t) n * dv), tail.g = malloc(sizeof(float) * (size_t) n);
        tail.beta = malloc(sizeof(float) * (size_t) n);
        for (int t = 0; t < n; t++) {
            const tokens * src = t < from_pre ? &pre : &x;
            const int at = t < from_pre ? p - from_pre + t : n_tok - from_x + (t - from_pre);
            memcpy(tail.q + (int64_t) t * dk, src->q + (int64_t) at * dk, sizeof(float) * (size_t) dk);
            memcpy(tail.k + (int64_t) t * dk, src->k + (int64_t) at * dk, sizeof(float) * (size_t) dk);
            memcpy(tail.v + (int64_t) t * dv, src->v + (int64_t) at * dv, sizeof(float) * (size_t) dv);
            tail.g[t] = src->g[at], tail.beta[t] = src->beta[at];
        }
        float * chunk_start = malloc(sizeof(float) * (size_t) ns);
        memcpy(chunk_start, st, sizeof(float) * (size_t) ns);
        advance_reference(&tail, n, dk, dv, chunk_start, Sr);
        free(chunk_start);
        free_tokens(&tail);
    }
    const double om = max_abs_d(od, (int64_t) n_tok * dv), sm = max_abs_d(Sd, ns);
    double ec = 0.0, esc = 0.0;
    for (int64_t i = 0; i < (int64_t) n_tok * dv; i++) ec = fmax(ec, fabs(oc[i] - od[i]));
    for (int64_t i = 0; i < ns; i++) esc = fmax(esc, fabs(Sr[i] - Sd[i]));
    printf("delta rule pos=%d n=%d dk=%d dv=%d: o %.2g (of max |o| %.3g); state %.2g\n", pos0, n_tok, dk, dv, ec / om, om,
           esc / sm);
    EXPECT(ec <= 1e-5 * om, "delta rule pos=%d n=%d: %.3g > 1e-5 * %.3g", pos0, n_tok, ec, om);
    EXPECT(esc <= 1e-5 * sm, "state pos=%d n=%d: %.3g > 1e-5 * %.3g", pos0, n_tok, esc, sm);
    free_tokens(&pre);
    free_tokens(&x);
    free(st), free(S0), free(scratch), free(opre), free(oc), free(Sd), free(od), free(Sr);
}

/* The same tokens from the same state through `rule` in one call, one token a call, and in uneven
 * pieces: the outputs and states must be the same floats. */
static void test_rule_pieces(rm_gdn_rule_fn rule, const char * name, int pos0, int n_tok, int dk, int dv) {
    tokens x = random_tokens(n_tok, dk, dv);
    const int64_t nst = rm_gdn_state_floats(dk, dv), no = (int64_t) n_tok * dv;
    float * base = randn(nst, 0.3f);   /* whatever state the earlier positions left */
    float * scratch = malloc(sizeof(float) * (size_t) rm_gdn_chunk_scratch(dk, dv));
    float * st[3], * o[3];
    const int cuts[] = {1, 7, 30, 2, 64, 5, 100};   /* the uneven pieces, repeated */
    for (int way = 0; way < 3; way++) {
        st[way] = malloc(sizeof(float) * (size_t) nst);
        memcpy(st[way], base, sizeof(float) * (size_t) nst);
        o[way] = calloc((size_t) no, sizeof(float));
        for (int t = 0, i = 0; t < n_tok; i++) {
            const int step = way == 0 ? n_tok : way == 1 ? 1 : cuts[i % 7];
            const int n = step < n_tok - t ? step : n_tok - t;
            const rm_gdn_head h = head_of(&x, t, n, dk, dv, o[way]);
            rule(&h, pos0 + t, st[way], scratch);
            t += n;
        }
    }
    const int same = !memcmp(o[0], o[1], sizeof(float) * (size_t) no) && !memcmp(o[0], o[2], sizeof(float) * (size_t) no) &&
                     !memcmp(st[0], st[1], sizeof(float) * (size_t) nst) && !memcmp(st[0], st[2], sizeof(float) * (size_t) nst);
    EXPECT(same, "%s delta rule pos=%d n=%d dk=%d dv=%d: pieces differ from one call", name, pos0, n_tok, dk, dv);
    for (int way = 0; way < 3; way++) free(st[way]), free(o[way]);
    free(base), free(scratch);
    free_tokens(&x);
}

static void test_conv(void) {
    enum { N = 8, C = 12, K = 4 };
    float * x = randn(N * C, 1.0f), * w = randn(C * K, 0.5f);
    float state1[(K - 1) * C] = {0}, state2[(K - 1) * C] = {0};
    float one[N * C], parts[N * C];
    rm_gdn_conv(one, x, N, C, C, state1, w, K);
    const int steps[] = {1, 2, 5};
    for (int i = 0, t = 0; i < 3; t += steps[i], i++) {
        rm_gdn_conv(parts + t * C, x + t * C, steps[i], C, C, state2, w, K);
    }
    double e = 0.0, eref = 0.0;
    for (int i = 0; i < N * C; i++) e = fmax(e, fabs(one[i] - parts[i]));
    for (int i = 0; i < (K - 1) * C; i++) e = fmax(e, fabs(state1[i] - state2[i]));
    for (int t = 0; t < N; t++) {
        for (int c = 0; c < C; c++) {
            double acc = 0.0;
            for (int i = 0; i < K; i++) {
                const int src = t - (K - 1) + i;
                acc += src < 0 ? 0.0 : (double) w[c * K + i] * x[src * C + c];
            }
            eref = fmax(eref, fabs(one[t * C + c] - acc / (1.0 + exp(-acc))));
        }
    }
    /* two slices of the channels (rows C apart) with their own state columns: the same floats */
    float state3[(K - 1) * C] = {0}, slices[N * C];
    rm_gdn_conv(slices, x, N, 5, C, state3, w, K);
    rm_gdn_conv(slices + 5, x + 5, N, C - 5, C, state3 + 5, w + 5 * K, K);
    for (int i = 0; i < N * C; i++) e = fmax(e, fabs(one[i] - slices[i]));
    for (int i = 0; i < (K - 1) * C; i++) e = fmax(e, fabs(state1[i] - state3[i]));
    EXPECT(e <= 1e-6, "conv in parts vs at once: %.3g", e);
    EXPECT(eref <= 1e-6, "conv vs reference: %.3g", eref);
    free(x);
    free(w);
}

/* The gated norm with either gate, silu (sigmoid 0) or sigmoid, against the formula in doubles. */
static void test_gated_norm(int sigmoid) {
    enum { R = 3, N = 16 };
    float * y = randn(R * N, 1.0f), * z = randn(R * N, 1.0f), * w = randn(N, 1.0f);
    float y0[R * N];
    memcpy(y0, y, sizeof(y0));
    rm_gdn_gated_norm(y, z, w, R, N, 1e-6f, sigmoid);
    double e = 0.0;
    for (int r = 0; r < R; r++) {
        double ss = 0.0;
        for (int i = 0; i < N; i++) ss += (double) y0[r * N + i] * y0[r * N + i];
        const double f = 1.0 / sqrt(ss / N + 1e-6);
        for (int i = 0; i < N; i++) {
            const double zz = z[r * N + i], gate = (sigmoid ? 1.0 : zz) / (1.0 + exp(-zz));
            const double want = y0[r * N + i] * f * w[i] * gate;
            e = fmax(e, fabs(y[r * N + i] - want) / (fabs(want) + 1e-3));
        }
    }
    EXPECT(e <= 1e-5, "gated norm (%s): %.3g", sigmoid ? "sigmoid" : "silu", e);
    free(y);
    free(z);
    free(w);
}

static double max_diff(const float * a, const float * b, int64_t n, double * max_b) {
    double e = 0.0;
    for (int64_t i = 0; i < n; i++) {
        e = fmax(e, fabs((double) a[i] - b[i]));
        *max_b = fmax(*max_b, fabs((double) b[i]));
    }
    return e;
}

/* The delta rule of `isa` against the scalar twin, from the same state and position. */
static void test_rule_isa(rm_isa isa, int pos0, int n_tok, int dk, int dv) {
    tokens x = random_tokens(n_tok, dk, dv);
    const int64_t nst = rm_gdn_state_floats(dk, dv), no = (int64_t) n_tok * dv;
    float * S1 = randn(nst, 0.3f), * S2 = malloc(sizeof(float) * (size_t) nst);
    memcpy(S2, S1, sizeof(float) * (size_t) nst);
    float * o1 = calloc((size_t) no, sizeof(float)), * o2 = calloc((size_t) no, sizeof(float));
    float * scratch = malloc(sizeof(float) * (size_t) rm_gdn_chunk_scratch(dk, dv));
    rm_gdn_head h = head_of(&x, 0, n_tok, dk, dv, o1);
    rm_gdn_rule(&h, pos0, S1, scratch);
    h.o = o2;
    rm_cpu_gdn_rule_isa(isa)(&h, pos0, S2, scratch);
    double om = 0.0, sm = 0.0;
    const double eo = max_diff(o2, o1, no, &om), es = max_diff(S2, S1, nst, &sm);
    printf("%s delta rule pos=%d n=%d dk=%d dv=%d: o %.2g, state %.2g relative\n", rm_isa_name(isa), pos0, n_tok, dk, dv,
           eo / om, es / sm);
    EXPECT(eo <= 1e-5 * om && es <= 1e-5 * sm, "%s delta rule pos=%d n=%d dk=%d dv=%d: o %.3g of %.3g, state %.3g of %.3g",
           rm_isa_name(isa), pos0, n_tok, dk, dv, eo, om, es, sm);
    test_rule_pieces(rm_cpu_gdn_rule_isa(isa), rm_isa_name(isa), pos0, n_tok, dk, dv);
    free(S1), free(S2), free(o1), free(o2), free(scratch);
    free_tokens(&x);
}

/* The conv of `isa` against the scalar twin, in calls of 1, 2 and 5 tokens (the state carried). */
static void test_conv_isa(rm_isa isa, int64_t C, int K) {
    enum { N = 8 };
    float * x = randn(N * C, 1.0f), * w = randn(C * K, 0.5f);
    float * st1 = calloc((size_t) ((K - 1) * C), sizeof(float)), * st2 = calloc((size_t) ((K - 1) * C), sizeof(float));
    float * y1 = malloc(sizeof(float) * (size_t) (N * C)), * y2 = malloc(sizeof(float) * (size_t) (N * C));
    const int steps[] = {1, 2, 5};
    for (int i = 0, t = 0; i < 3; t += steps[i], i++) {
        rm_gdn_conv(y1 + t * C, x + t * C, steps[i], C, C, st1, w, K);
        /* a slice of the channels per call, as threads take them: the same floats as the whole */
        const int64_t c0 = C >= 16 ? 8 : 0;
        rm_cpu_gdn_conv_isa(isa)(y2 + t * C, x + t * C, steps[i], c0, C, st2, w, K);
        rm_cpu_gdn_conv_isa(isa)(y2 + t * C + c0, x + t * C + c0, steps[i], C - c0, C, st2 + c0, w + c0 * K, K);
    }
    double ym = 0.0, sm = 0.0;
    const double ey = max_diff(y2, y1, N * C, &ym), es = max_diff(st2, st1, (K - 1) * C, &sm);
    printf("%s conv C=%lld: %.2g relative\n", rm_isa_name(isa), (long long) C, ey / ym);
    EXPECT(ey <= 1e-5 * ym && es == 0.0, "%s conv C=%lld K=%d: %.3g of %.3g, state %.3g", rm_isa_name(isa),
           (long long) C, K, ey, ym, es);
    float * bufs[] = {x, w, st1, st2, y1, y2};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) free(bufs[i]);
}

static void test_isas(void) {
    for (int isa = RM_ISA_SCALAR; isa <= (int) rm_isa_best(); isa++) {
        /* {position, tokens, d_k, d_v}: one token (decoding), across chunk boundaries, from inside a
         * chunk; shapes that take the vector path and ones that fall back to the twin */
        const int shapes[][4] = {{0, 1, 16, 16}, {61, 5, 128, 128}, {3, RM_GDN_CHUNK + 37, 128, 128}, {0, 5, 32, 24},
                                 {10, 70, 16, 8}, {0, 9, 12, 16}, {63, 3, 16, 20}, {5, 4, 8, 12}};
        for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
            test_rule_isa((rm_isa) isa, shapes[i][0], shapes[i][1], shapes[i][2], shapes[i][3]);
        }
        test_conv_isa((rm_isa) isa, 24, 4);
        test_conv_isa((rm_isa) isa, 12, 4);
        test_conv_isa((rm_isa) isa, 16, 2);
    }
}

int main(void) {
    const int lens[] = {1, 5, RM_GDN_CHUNK, RM_GDN_CHUNK + 1, 2 * RM_GDN_CHUNK + 37};
    for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
        test_delta_rule(0, lens[i], 16, 16);
        test_delta_rule(RM_GDN_CHUNK + 23, lens[i], 16, 16);   /* from inside a chunk */
    }
    test_delta_rule(0, 100, 32, 8);
    test_delta_rule(2 * RM_GDN_CHUNK - 1, 70, 8, 48);
    test_rule_pieces(rm_gdn_rule, "scalar", 0, 3 * RM_GDN_CHUNK + 11, 16, 24);
    test_rule_pieces(rm_gdn_rule, "scalar", 40, 200, 12, 8);
    test_conv();
    test_gated_norm(0);
    test_gated_norm(1);
    test_isas();
    printf("%d passed, %d failed\n", n_passed, n_failed);
    return n_failed ? 1 : 0;
}
