/* rope.cu - one thread per rotated pair (see rope.cuh). */
#include "rope.cuh"

__global__ void k_rope(float * x, int32_t n_tok, int32_t n_head, int32_t head_dim, int32_t n_rot, int32_t pos0,
                       float base, int neox, const float * div) {
    const int32_t half = n_rot / 2;
    const int64_t id = (int64_t) blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= (int64_t) n_tok * n_head * half) {
        return;
    }
    const int32_t i = (int32_t) (id % half);
    const int64_t th = id / half;                /* token * n_head + head */
    const int32_t t = (int32_t) (th / n_head);
    float * v = x + th * head_dim;
    /* the same float expressions as the host: powf, then cosf/sinf of a float angle */
    const float inv_freq = 1.0f / powf(base, (float) (2 * i) / (float) n_rot) / (div ? div[i] : 1.0f);
    const float angle = (float) (pos0 + t) * inv_freq;
    const float c = cosf(angle), s = sinf(angle);
    const int32_t a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
    const float x0 = v[a], x1 = v[b];
    v[a] = x0 * c - x1 * s;
    v[b] = x0 * s + x1 * c;
}

__global__ void k_rope_yarn(float * x, int32_t n_tok, int32_t n_head, int32_t head_dim, int32_t n_rot, int32_t pos0,
                            rm_rope_yarn y, int neox) {
    const int32_t half = n_rot / 2;
    const int64_t id = (int64_t) blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= (int64_t) n_tok * n_head * half) {
        return;
    }
    const int32_t i = (int32_t) (id % half);
    const int64_t th = id / half;
    const int32_t t = (int32_t) (th / n_head);
    float * v = x + th * head_dim;
    const float width = y.corr_hi - y.corr_lo > 0.001f ? y.corr_hi - y.corr_lo : 0.001f;
    const float inv_extrap = 1.0f / powf(y.base, (float) (2 * i) / (float) n_rot);
    const float r = ((float) i - y.corr_lo) / width;
    const float keep = 1.0f - (r < 0.0f ? 0.0f : r > 1.0f ? 1.0f : r);
    const float inv_freq = inv_extrap * y.freq_scale * (1.0f - keep) + inv_extrap * keep;
    const float angle = (float) (pos0 + t) * inv_freq;
    const float c = cosf(angle) * y.mscale, s = sinf(angle) * y.mscale;
    const int32_t a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
    const float x0 = v[a], x1 = v[b];
    v[a] = x0 * c - x1 * s;
    v[b] = x0 * s + x1 * c;
}

cudaError_t rm_cu_rope_yarn(cudaStream_t st, float * x, int32_t n_tok, int32_t n_head, int32_t head_dim, int32_t n_rot,
                            int32_t pos0, rm_rope_yarn y, int neox) {
    const int64_t n = (int64_t) n_tok * n_head * (n_rot / 2);
    if (n <= 0) {
        return cudaSuccess;
    }
    k_rope_yarn<<<rm_cu_blocks(n, 256), 256, 0, st>>>(x, n_tok, n_head, head_dim, n_rot, pos0, y, neox);
    return cudaGetLastError();
}

cudaError_t rm_cu_rope(cudaStream_t st, float * x, int32_t n_tok, int32_t n_head, int32_t head_dim, int32_t n_rot,
                       int32_t pos0, float base, int neox) {
    const int64_t n = (int64_t) n_tok * n_head * (n_rot / 2);
    if (n <= 0) {
        return cudaSuccess;
    }
    k_rope<<<rm_cu_blocks(n, 256), 256, 0, st>>>(x, n_tok, n_head, head_dim, n_rot, pos0, base, neox, NULL);
    return cudaGetLastError();
}

cudaError_t rm_cu_rope_div(cudaStream_t st, float * x, int32_t n_tok, int32_t n_head, int32_t head_dim, int32_t n_rot,
                           int32_t pos0, float base, int neox, const float * div) {
    const int64_t n = (int64_t) n_tok * n_head * (n_rot / 2);
    if (n <= 0) {
        return cudaSuccess;
    }
    k_rope<<<rm_cu_blocks(n, 256), 256, 0, st>>>(x, n_tok, n_head, head_dim, n_rot, pos0, base, neox, div);
    return cudaGetLastError();
}
