// kernels/reduce_scatter/push.cu: the reduce-scatter of the push protocol (kernels/push.cuh) and
// its entry points mcast_reduce_scatter_p2p_push_<dtype>_<op>: every rank stores block p of its
// data into rank p's scratch rows and reduces its own block from what its peers stored (nranks <=
// MCAST_PUSH_MAX_RANKS; no barrier, no load of a peer's memory).
#define REDUCE_SCATTER_PUSH(DN, D, ON, O)                                \
  MCAST_WHEN(MCAST_SEL_reduce_scatter, MCAST_SEL_##DN, MCAST_SEL_##ON)( \
      KERNEL mcast_reduce_scatter_p2p_push_##DN##_##ON(ARGS) { MCAST_ENTRY; p2p_push<D, O, MCAST_PUSH_RS>(a); })
MCAST_EACH_REDUCTION(REDUCE_SCATTER_PUSH)
