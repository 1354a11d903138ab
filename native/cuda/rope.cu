/* rope.cu - one thread per rotated pair (see rope.cuh). */
#include "rope.cuh"

__global__ void k_rope(float * x, int32_t n_tok, int32_t n_head, int32_t head_dim, int32_t n_rot, int32_t pos0,
                       float base, int neox) {
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
    const float inv_freq = 1.0f / powf(base, (float) (2 * i) / (float) n_rot);
    const float angle = (float) (pos0 + t) * inv_freq;
    const float c = cosf(angle), s = sinf(angle);
    const int32_t a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
    const float x0 = v[a], x1 = v[b];
    v[a] = x0 * c - x1 * s;
    v[b] = x0 * s + x1 * c;
}

cudaError_t rm_cu_rope(cudaStream_t st, float * x, int32_t n_tok, int32_t n_head, int32_t head_dim, int32_t n_rot,
                       int32_t pos0, float base, int neox) {
    const int64_t n = (int64_t) n_tok * n_head * (n_rot / 2);
    if (n <= 0) {
        return cudaSuccess;
    }
    k_rope<<<rm_cu_blocks(n, 256), 256, 0, st>>>(x, n_tok, n_head, head_dim, n_rot, pos0, base, neox);
    return cudaGetLastError();
}
