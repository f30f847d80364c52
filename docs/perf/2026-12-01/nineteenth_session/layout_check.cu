// The nineteenth session's host check (no GPU) of the closed form that branch source-probes' register source
// uses for the cooperative 128x256 kernel's accumulator coordinates, against CuTe's own partition:
//   nvcc -std=c++20 --expt-relaxed-constexpr -I.deps/cutlass/include -x cu layout_check.cu -o /tmp/layout_check && /tmp/layout_check
// Output then: ((_2,_2,_32),_1,_1):((_1@1,_8@0,_8@1),_0,_0)  size 128 / 0 of 32768 coordinates differ
#include <cstdio>
#include "cute/tensor.hpp"
#include "cute/atom/mma_atom.hpp"
#include "cute/arch/mma_sm90.hpp"
#include "cute/atom/mma_traits_sm90_gmma.hpp"
using namespace cute;
int main() {
  auto mma = make_tiled_mma(SM90_64x256x16_F32BF16BF16_SS<GMMA::Major::K, GMMA::Major::MN>{}, Layout<Shape<_2, _1, _1>>{});
  int bad = 0, n = 0;
  for (int t = 0; t < 256; ++t) {
    auto c = mma.get_thread_slice(t).partition_C(make_identity_tensor(make_shape(Int<128>{}, Int<256>{})));
    if (t == 0) { print(c.layout()); printf("  size %d\n", int(size(c))); }
    const int wg = t / 128, warp = (t % 128) / 32, lane = t % 32;
    for (int e = 0; e < int(size(c)); ++e) {
      const int i = e / 2, v0 = e % 2, v1 = i % 2, v2 = i / 2;
      const int row = wg * 64 + 16 * warp + lane / 4 + 8 * v1;
      const int col = 2 * (lane % 4) + v0 + 8 * v2;
      ++n;
      if (get<0>(c(e)) != row || get<1>(c(e)) != col) {
        if (bad++ < 5) printf("t %d e %d: cute (%d,%d) formula (%d,%d)\n", t, e, int(get<0>(c(e))), int(get<1>(c(e))), row, col);
      }
    }
  }
  printf("%d of %d coordinates differ\n", bad, n);
  return bad != 0;
}
