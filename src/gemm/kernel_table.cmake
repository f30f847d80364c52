# The GEMM kernels weft compiles: one row per kernel, one generated
# translation unit per row (cmake/WeftGemmKernels.cmake), so a parallel build
# compiles them side by side. The row is the kernel's KernelSpec
# (src/gemm/cutlass_kernel.cuh); its name and its entry in the configuration
# list follow from it. The list's order is the tuner's candidate order.
#
#   weft_gemm_kernel(INPUT OUTPUT B_LAYOUT TILE_MxNxK CLUSTER_MxN SCHEDULE HOOK [SUBSET])
#     INPUT, OUTPUT  bf16 | fp16 | fp32
#     B_LAYOUT       nk (B as [N, K], a Linear's weight) | kn
#     TILE, CLUSTER  the output tile and the cluster, along our M and N
#     SCHEDULE       cooperative | pingpong | cooperative_streamK | cooperative_swapped (D^T = B x A^T; decision 0018)
#     HOOK           none | hooked (mainloop waits, reports rows) | hooked_source (D = A x B + source,
#                    waits for source rows) | hooked_add (adds rows into another matrix; decision 0033)
#     SUBSET         compiled also when WEFT_GEMM_KERNELS=subset (CI without a GPU): every kernel
#                    template, schedule and hook once per type, and every name a plan forces
#                    (GemmRs's ring steps); GPU builds compile every row.

# bf16, plain
weft_gemm_kernel(bf16 bf16 nk 128x256x64 2x1 cooperative none SUBSET)
weft_gemm_kernel(bf16 bf16 nk 128x256x64 1x2 cooperative none)
weft_gemm_kernel(bf16 bf16 nk 128x256x64 2x1 cooperative_streamK none SUBSET)
weft_gemm_kernel(bf16 bf16 nk 256x128x64 1x2 cooperative none)
weft_gemm_kernel(bf16 bf16 nk 256x128x64 2x1 cooperative none)
weft_gemm_kernel(bf16 bf16 nk 128x128x64 2x1 cooperative none)
weft_gemm_kernel(bf16 bf16 nk 64x256x64 1x1 pingpong none SUBSET)
weft_gemm_kernel(bf16 bf16 nk 144x256x64 1x2 cooperative_swapped none SUBSET)
weft_gemm_kernel(bf16 bf16 kn 128x256x64 2x1 cooperative none SUBSET)
weft_gemm_kernel(bf16 bf16 kn 64x256x64 1x1 pingpong none)
# bf16 in, fp32 out
weft_gemm_kernel(bf16 fp32 nk 128x256x64 2x1 cooperative none SUBSET)
# fp16, plain: bf16's rows, in the same order
weft_gemm_kernel(fp16 fp16 nk 128x256x64 2x1 cooperative none SUBSET)
weft_gemm_kernel(fp16 fp16 nk 128x256x64 1x2 cooperative none)
weft_gemm_kernel(fp16 fp16 nk 128x256x64 2x1 cooperative_streamK none)
weft_gemm_kernel(fp16 fp16 nk 256x128x64 1x2 cooperative none)
weft_gemm_kernel(fp16 fp16 nk 256x128x64 2x1 cooperative none)
weft_gemm_kernel(fp16 fp16 nk 128x128x64 2x1 cooperative none)
weft_gemm_kernel(fp16 fp16 nk 64x256x64 1x1 pingpong none)
weft_gemm_kernel(fp16 fp16 nk 144x256x64 1x2 cooperative_swapped none)
weft_gemm_kernel(fp16 fp16 kn 128x256x64 2x1 cooperative none SUBSET)
weft_gemm_kernel(fp16 fp16 kn 64x256x64 1x1 pingpong none)
# fp16 in, fp32 out
weft_gemm_kernel(fp16 fp32 nk 128x256x64 2x1 cooperative none)
# bf16, hooked (tile_hooks.cuh)
weft_gemm_kernel(bf16 bf16 nk 128x256x64 2x1 cooperative hooked SUBSET)
weft_gemm_kernel(bf16 bf16 nk 256x128x64 2x1 cooperative hooked)
weft_gemm_kernel(bf16 bf16 nk 128x256x64 2x1 cooperative hooked_source SUBSET)
weft_gemm_kernel(bf16 bf16 nk 256x128x64 2x1 cooperative hooked_source)
weft_gemm_kernel(bf16 bf16 kn 128x256x64 2x1 cooperative hooked_source SUBSET)
weft_gemm_kernel(bf16 bf16 nk 128x256x64 1x2 cooperative hooked)
weft_gemm_kernel(bf16 bf16 nk 128x256x64 1x2 cooperative hooked_source)
weft_gemm_kernel(bf16 bf16 nk 128x128x64 1x2 pingpong none)
weft_gemm_kernel(bf16 bf16 nk 128x256x64 2x1 cooperative hooked_add SUBSET)
weft_gemm_kernel(bf16 bf16 kn 128x256x64 2x1 cooperative hooked_add SUBSET)
# Last of bf16's, so that a hooked plan's first candidate (the pick under graph
# capture, untuned) is one that can report too.
weft_gemm_kernel(bf16 bf16 nk 128x128x64 1x2 pingpong hooked_source SUBSET)
# fp16, hooked: bf16's rows (the overlapped operators' kernels), in the same order
weft_gemm_kernel(fp16 fp16 nk 128x256x64 2x1 cooperative hooked SUBSET)
weft_gemm_kernel(fp16 fp16 nk 256x128x64 2x1 cooperative hooked)
weft_gemm_kernel(fp16 fp16 nk 128x256x64 2x1 cooperative hooked_source SUBSET)
weft_gemm_kernel(fp16 fp16 nk 256x128x64 2x1 cooperative hooked_source)
weft_gemm_kernel(fp16 fp16 kn 128x256x64 2x1 cooperative hooked_source SUBSET)
weft_gemm_kernel(fp16 fp16 nk 128x256x64 1x2 cooperative hooked)
weft_gemm_kernel(fp16 fp16 nk 128x256x64 1x2 cooperative hooked_source)
weft_gemm_kernel(fp16 fp16 nk 128x128x64 1x2 pingpong none)
weft_gemm_kernel(fp16 fp16 nk 128x256x64 2x1 cooperative hooked_add SUBSET)
weft_gemm_kernel(fp16 fp16 kn 128x256x64 2x1 cooperative hooked_add SUBSET)
weft_gemm_kernel(fp16 fp16 nk 128x128x64 1x2 pingpong hooked_source SUBSET)

# Grouped GEMMs (weft::GroupedGemm, src/gemm/grouped_kernel.cuh): every expert's
# rows times its weight in one persistent launch.
#   weft_grouped_gemm_kernel(INPUT OUTPUT B_LAYOUT TILE_MxNxK CLUSTER_MxN SCHEDULE HOOK [SUBSET])
#     the dense rows' fields; OUTPUT the input type, SCHEDULE cooperative, HOOK none
#     (every grouped kernel carries the wait and report seams).
# Per types and layout, a wide tile for experts with many rows (2x1 clusters
# share each weight tile between two row tiles) and a narrow one for few rows
# or narrow N; GroupedGemm's size heuristic picks between them
# (docs/decisions/0056). The subset compiles both types, both layouts and both
# tiles once.
weft_grouped_gemm_kernel(bf16 bf16 nk 128x256x64 2x1 cooperative none SUBSET)
weft_grouped_gemm_kernel(bf16 bf16 nk 128x128x64 1x1 cooperative none)
weft_grouped_gemm_kernel(bf16 bf16 kn 128x256x64 2x1 cooperative none)
weft_grouped_gemm_kernel(bf16 bf16 kn 128x128x64 1x1 cooperative none)
weft_grouped_gemm_kernel(fp16 fp16 nk 128x256x64 2x1 cooperative none)
weft_grouped_gemm_kernel(fp16 fp16 nk 128x128x64 1x1 cooperative none)
weft_grouped_gemm_kernel(fp16 fp16 kn 128x256x64 2x1 cooperative none)
weft_grouped_gemm_kernel(fp16 fp16 kn 128x128x64 1x1 cooperative none SUBSET)
