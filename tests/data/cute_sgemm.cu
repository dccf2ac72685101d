// A CuTe tiled SGEMM (C = alpha * A * B^T + beta * C, all column-major, "NT"):
// one CTA per 128x128 tile of C, 256 threads, K consumed 8 columns at a time
// through shared memory. Written after the shape of CUTLASS's
// examples/cute/tutorial/sgemm_1.cu; no predication, so M and N must be
// multiples of 128 and K a multiple of 8. Device code only: it compiles with
// NVRTC (-I to the CUTLASS and CCCL include dirs) and with nvcc.
#include <cute/tensor.hpp>

namespace safejit_cute {

using namespace cute;

template <class Shape3, class Tiler,
          class SmemA, class ThrA, class SmemB, class ThrB, class ThrC,
          class StrideA, class StrideB, class StrideC>
__device__ void tiled_gemm(Shape3 mnk, Tiler tiler,
                           float const* A, StrideA dA, SmemA sA_layout, ThrA tA,
                           float const* B, StrideB dB, SmemB sB_layout, ThrB tB,
                           float* C, StrideC dC, ThrC tC,
                           float alpha, float beta)
{
  // Whole-problem views in global memory.
  Tensor mA = make_tensor(make_gmem_ptr(A), select<0, 2>(mnk), dA);  // (M,K)
  Tensor mB = make_tensor(make_gmem_ptr(B), select<1, 2>(mnk), dB);  // (N,K)
  Tensor mC = make_tensor(make_gmem_ptr(C), select<0, 1>(mnk), dC);  // (M,N)

  // This CTA's tiles; the K mode stays whole to loop over.
  auto here = make_coord(blockIdx.x, blockIdx.y, _);
  Tensor gA = local_tile(mA, tiler, here, Step<_1,  X, _1>{});  // (BM,BK,k)
  Tensor gB = local_tile(mB, tiler, here, Step< X, _1, _1>{});  // (BN,BK,k)
  Tensor gC = local_tile(mC, tiler, here, Step<_1, _1,  X>{});  // (BM,BN)

  __shared__ float bufA[cosize_v<SmemA>];
  __shared__ float bufB[cosize_v<SmemB>];
  Tensor sA = make_tensor(make_smem_ptr(bufA), sA_layout);  // (BM,BK)
  Tensor sB = make_tensor(make_smem_ptr(bufB), sB_layout);  // (BN,BK)

  // Who copies what from global to shared memory.
  Tensor tAgA = local_partition(gA, tA, threadIdx.x);
  Tensor tAsA = local_partition(sA, tA, threadIdx.x);
  Tensor tBgB = local_partition(gB, tB, threadIdx.x);
  Tensor tBsB = local_partition(sB, tB, threadIdx.x);

  // Who computes which part of C, and what it reads for it.
  Tensor tCsA = local_partition(sA, tC, threadIdx.x, Step<_1,  X>{});
  Tensor tCsB = local_partition(sB, tC, threadIdx.x, Step< X, _1>{});
  Tensor tCgC = local_partition(gC, tC, threadIdx.x, Step<_1, _1>{});
  Tensor acc = make_tensor_like(tCgC);
  clear(acc);

  int const k_tiles = size<2>(tAgA);
  for (int k = 0; k < k_tiles; ++k) {
    copy(tAgA(_, _, k), tAsA);
    copy(tBgB(_, _, k), tBsB);
    cp_async_fence();
    cp_async_wait<0>();
    __syncthreads();
    gemm(tCsA, tCsB, acc);  // UniversalFMA, from cute/arch/mma.hpp
    __syncthreads();
  }
  axpby(alpha, acc, beta, tCgC);
}

}  // namespace safejit_cute

// C(M,N) = alpha * A(M,K) * B(N,K)^T + beta * C(M,N); lda >= M, ldb >= N, ldc >= M.
extern "C" __global__ void __launch_bounds__(256)
cute_sgemm_nt(int m, int n, int k,
              float alpha, float const* A, int lda, float const* B, int ldb,
              float beta, float* C, int ldc)
{
  using namespace cute;
  auto bM = Int<128>{};
  auto bN = Int<128>{};
  auto bK = Int<8>{};
  safejit_cute::tiled_gemm(
      make_shape(m, n, k), make_shape(bM, bN, bK),
      A, make_stride(Int<1>{}, lda), make_layout(make_shape(bM, bK)), make_layout(make_shape(Int<32>{}, Int<8>{})),
      B, make_stride(Int<1>{}, ldb), make_layout(make_shape(bN, bK)), make_layout(make_shape(Int<32>{}, Int<8>{})),
      C, make_stride(Int<1>{}, ldc), make_layout(make_shape(Int<16>{}, Int<16>{})),
      alpha, beta);
}
