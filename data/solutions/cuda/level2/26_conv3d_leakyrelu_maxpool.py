"""Level-2 task 26 (Conv3d + LeakyReLU + MaxPool3d(2)): CUDA solution, direct convolution with the cheap ops fused into its epilogue or a second kernel."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <cuda_runtime.h>
#include <cstdint>
#include <algorithm>

static void check_input(const torch::Tensor& t, const char* name) {
    TORCH_CHECK(t.is_cuda(), name, " must be a CUDA tensor");
    TORCH_CHECK(t.scalar_type() == torch::kFloat32, name, " must be float32");
}

static void check_launch(const char* what) {
    const cudaError_t err = cudaGetLastError();
    TORCH_CHECK(err == cudaSuccess, what, " launch failed: ", cudaGetErrorString(err));
}

constexpr int OCB = 8;        // output channels computed by one thread
constexpr int THREADS = 256;  // output positions per block
constexpr int SMEM_FLOATS = 8192;

// Direct 3-D convolution, NCDHW input, (K, C, T, R, S) weights, LeakyReLU fused in the epilogue.
// One thread owns one output position and OCB consecutive output channels; those channels' weights
// are staged in shared memory per chunk of input channels, laid out [c][t][r][s][oc].
__global__ void __launch_bounds__(THREADS) conv3d_leaky_kernel(
    const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ b,
    float* __restrict__ y, float slope,
    int N, int C, int D, int H, int W, int K, int T, int R, int S, int OD, int OH, int OW,
    int stride, int pad, int dil, int cchunk) {
    extern __shared__ float4 smem4[];
    float* ws = reinterpret_cast<float*>(smem4);
    const int groups = (K + OCB - 1) / OCB;
    const int64_t plane = (int64_t)OH * OW;
    const int64_t P = (int64_t)OD * plane;
    const int64_t tiles = (P + THREADS - 1) / THREADS;
    int64_t bid = blockIdx.x;
    const int g = (int)(bid % groups);
    bid /= groups;
    const int64_t tile = bid % tiles;
    const int n = (int)(bid / tiles);
    const int oc0 = g * OCB;
    const int64_t p = tile * THREADS + threadIdx.x;
    const bool valid = p < P;
    const int od = valid ? (int)(p / plane) : 0;
    const int64_t rem = valid ? p - (int64_t)od * plane : 0;
    const int oh = (int)(rem / OW);
    const int ow = (int)(rem - (int64_t)oh * OW);
    const int TRS = T * R * S;
    const int id0 = od * stride - pad;
    const int ih0 = oh * stride - pad;
    const int iw0 = ow * stride - pad;

    float acc[OCB];
#pragma unroll
    for (int j = 0; j < OCB; ++j) acc[j] = 0.0f;

    for (int c0 = 0; c0 < C; c0 += cchunk) {
        const int cn = min(cchunk, C - c0);
        const int total = OCB * cn * TRS;
        __syncthreads();
        for (int i = threadIdx.x; i < total; i += THREADS) {
            const int j = i % OCB;
            const int t = i / OCB;  // (c - c0) * TRS + (kt * R + kr) * S + ks
            const int oc = oc0 + j;
            ws[i] = oc < K ? w[((int64_t)oc * C + c0) * TRS + t] : 0.0f;
        }
        __syncthreads();
        if (valid) {
            for (int cl = 0; cl < cn; ++cl) {
                const float* xc = x + ((int64_t)n * C + c0 + cl) * D * H * W;
                const float* wc = ws + cl * TRS * OCB;
                for (int kt = 0; kt < T; ++kt) {
                    const int id = id0 + kt * dil;
                    if (id < 0 || id >= D) continue;
                    for (int kr = 0; kr < R; ++kr) {
                        const int ih = ih0 + kr * dil;
                        if (ih < 0 || ih >= H) continue;
                        const float* xr = xc + ((int64_t)id * H + ih) * W;
                        const float* wr = wc + (kt * R + kr) * S * OCB;
                        for (int ks = 0; ks < S; ++ks) {
                            const int iw = iw0 + ks * dil;
                            if (iw < 0 || iw >= W) continue;
                            const float v = __ldg(xr + iw);
                            const float4 wa = *reinterpret_cast<const float4*>(wr + ks * OCB);
                            const float4 wb = *reinterpret_cast<const float4*>(wr + ks * OCB + 4);
                            acc[0] = fmaf(v, wa.x, acc[0]);
                            acc[1] = fmaf(v, wa.y, acc[1]);
                            acc[2] = fmaf(v, wa.z, acc[2]);
                            acc[3] = fmaf(v, wa.w, acc[3]);
                            acc[4] = fmaf(v, wb.x, acc[4]);
                            acc[5] = fmaf(v, wb.y, acc[5]);
                            acc[6] = fmaf(v, wb.z, acc[6]);
                            acc[7] = fmaf(v, wb.w, acc[7]);
                        }
                    }
                }
            }
        }
    }
    if (!valid) return;
#pragma unroll
    for (int j = 0; j < OCB; ++j) {
        const int oc = oc0 + j;
        if (oc < K) {
            const float v = acc[j] + b[oc];
            y[((int64_t)n * K + oc) * P + p] = v > 0.0f ? v : v * slope;
        }
    }
}

// 2x2x2 / stride-2 max pooling (floor mode) over volumes of OD x OH x OW.
__global__ void maxpool3d2_kernel(const float* __restrict__ in, float* __restrict__ out, int64_t vols,
                                  int OD, int OH, int OW, int PD, int PH, int PW) {
    const int64_t total = vols * PD * PH * PW;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int pw = (int)(i % PW);
        int64_t t = i / PW;
        const int ph = (int)(t % PH);
        t /= PH;
        const int pd = (int)(t % PD);
        const int64_t vol = t / PD;
        const float* src = in + ((vol * OD + 2 * pd) * OH + 2 * ph) * (int64_t)OW + 2 * pw;
        float m = src[0];
        for (int a = 0; a < 2; ++a)
            for (int c = 0; c < 2; ++c) {
                const float* row = src + ((int64_t)a * OH + c) * OW;
                m = fmaxf(m, fmaxf(row[0], row[1]));
            }
        out[i] = m;
    }
}

torch::Tensor conv3d_leakyrelu_maxpool_forward(torch::Tensor x, torch::Tensor weight, torch::Tensor bias, double negative_slope, int64_t stride, int64_t padding, int64_t dilation) {
    check_input(x, "x");
    check_input(weight, "weight");
    check_input(bias, "bias");
    TORCH_CHECK(x.dim() == 5 && weight.dim() == 5, "expected a 5-D input and a 5-D weight");
    TORCH_CHECK(weight.size(1) == x.size(1), "weight and input channel counts differ");
    TORCH_CHECK(stride > 0 && padding >= 0 && dilation > 0, "bad convolution hyper-parameters");
    auto xc = x.contiguous();
    auto wc = weight.contiguous();
    auto bc = bias.contiguous();
    const int64_t N = xc.size(0), C = xc.size(1), D = xc.size(2), H = xc.size(3), W = xc.size(4);
    const int64_t K = wc.size(0), T = wc.size(2), R = wc.size(3), S = wc.size(4);
    TORCH_CHECK(bc.numel() == K, "conv bias size mismatch");
    const int64_t OD = (D + 2 * padding - dilation * (T - 1) - 1) / stride + 1;
    const int64_t OH = (H + 2 * padding - dilation * (R - 1) - 1) / stride + 1;
    const int64_t OW = (W + 2 * padding - dilation * (S - 1) - 1) / stride + 1;
    TORCH_CHECK(OD > 0 && OH > 0 && OW > 0, "convolution output would be empty");
    const int64_t TRS = T * R * S;
    TORCH_CHECK(OCB * TRS <= SMEM_FLOATS, "convolution window too large for this kernel");
    int64_t cchunk = SMEM_FLOATS / (OCB * TRS);
    if (cchunk > C) cchunk = C;
    if (cchunk < 1) cchunk = 1;
    auto act = torch::empty({N, K, OD, OH, OW}, xc.options());
    const int64_t groups = (K + OCB - 1) / OCB;
    const int64_t tiles = (OD * OH * OW + THREADS - 1) / THREADS;
    const int64_t blocks = N * tiles * groups;
    TORCH_CHECK(blocks < 2147483647LL, "too many blocks");
    const size_t smem = (size_t)(OCB * cchunk * TRS) * sizeof(float);
    conv3d_leaky_kernel<<<(unsigned int)blocks, THREADS, smem>>>(
        xc.data_ptr<float>(), wc.data_ptr<float>(), bc.data_ptr<float>(), act.data_ptr<float>(),
        (float)negative_slope, (int)N, (int)C, (int)D, (int)H, (int)W, (int)K, (int)T, (int)R, (int)S,
        (int)OD, (int)OH, (int)OW, (int)stride, (int)padding, (int)dilation, (int)cchunk);
    check_launch("conv3d_leaky_kernel");
    const int64_t PD = OD / 2, PH = OH / 2, PW = OW / 2;
    auto y = torch::empty({N, K, PD, PH, PW}, xc.options());
    const int64_t total = N * K * PD * PH * PW;
    if (total > 0) {
        const int threads = 256;
        const int64_t pblocks = std::min<int64_t>((total + threads - 1) / threads, 1 << 20);
        maxpool3d2_kernel<<<(unsigned int)pblocks, threads>>>(act.data_ptr<float>(), y.data_ptr<float>(), N * K,
                                                              (int)OD, (int)OH, (int)OW, (int)PD, (int)PH, (int)PW);
        check_launch("maxpool3d2_kernel");
    }
    return y;
}
"""

cpp_source = "torch::Tensor conv3d_leakyrelu_maxpool_forward(torch::Tensor x, torch::Tensor weight, torch::Tensor bias, double negative_slope, int64_t stride, int64_t padding, int64_t dilation);"

_ext = load_inline(
    name="kevin_l2_conv3d_leakyrelu_maxpool_cuda",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["conv3d_leakyrelu_maxpool_forward"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, negative_slope):
        super().__init__()
        self.conv = nn.Conv3d(in_channels, out_channels, kernel_size)
        self.negative_slope = negative_slope
        self.pool = nn.MaxPool3d(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ext.conv3d_leakyrelu_maxpool_forward(
            x, self.conv.weight, self.conv.bias, float(self.negative_slope), 1, 0, 1
        )
