// kernels/all_gather/pull.cu: the all-gather by pulls (every rank copies every peer's block) and
// its entry point mcast_all_gather_p2p.

// All-gather (pull): rank r copies block q (count bytes at q*count) from rank q's data into its
// out (at q*out_stride), for every q != r (and q == r out of place), peers in the walk order of
// peer_at (r + 1 first, its own block last).
__device__ void all_gather_p2p(const McastArgs& a) {
  if (!barrier<false>(a, 0)) return;
  const u64 stride = out_stride(a);
  for (u32 i = 0; i < a.nranks; ++i) {
    const u32 q = peer_at(a, i);
    if (q != a.rank || a.out[a.rank] != a.data[a.rank])
      copy_bytes(a.out[a.rank] + (u64)q * stride, a.data[q] + (u64)q * a.count, a.count);
  }
  barrier<false>(a, 1);
}

MCAST_WHEN(MCAST_SEL_all_gather, 1, 1)(
    KERNEL mcast_all_gather_p2p(ARGS) { MCAST_ENTRY; all_gather_p2p(a); })
