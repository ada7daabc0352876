/* embed.cu — token embedding lookup (docs/MODEL.md §4.2): h[t] = embed_tokens[token_t], dequantized in fp32
 * (MLX affine: float(scale) * q + float(bias)) or widened from bf16. grid = n tokens, block = 256. */
#include "embed.cuh"

__global__ void embed_kernel(dmat e, const int *tokens, float *h, int hidden)
{
    const int t = blockIdx.x;
    int tok = tokens[t];
    tok = min(max(tok, 0), e.rows - 1);
    const uint8_t *row = e.data + (size_t)tok * e.row_bytes;
    float *out = h + (size_t)t * hidden;
    for (int c = threadIdx.x; c < hidden; c += blockDim.x) {
        float v;
        if (e.bits == 16) {
            v = bf2f(reinterpret_cast<const __nv_bfloat16 *>(row)[c]);
        } else {
            const unsigned int w = reinterpret_cast<const unsigned int *>(row)[c * e.bits / 32];
            const unsigned int q = (w >> ((c * e.bits) % 32)) & ((1u << e.bits) - 1u);
            const size_t g = (size_t)tok * (hidden / 64) + c / 64;
            v = fmaf(bf2f(e.scales[g]), (float)q, bf2f(e.biases[g]));
        }
        out[c] = v;
    }
}

cudaError_t launch_embed(const dmat &e, const int *tokens, int n, float *h, int hidden, int *bad_token,
                         cudaStream_t s)
{
    (void)bad_token;
    embed_kernel<<<n, 256, 0, s>>>(e, tokens, h, hidden);
    return cudaGetLastError();
}
