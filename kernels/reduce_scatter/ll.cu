// kernels/reduce_scatter/ll.cu: the LL reduce-scatter's entry points
// mcast_reduce_scatter_ll_<dtype>_<op> (the LL protocol and ll_reduce are in ll.cuh).

#define REDUCE_SCATTER_LL(DN, D, ON, O)                                                             \
  MCAST_WHEN(MCAST_SEL_reduce_scatter, MCAST_SEL_##DN, MCAST_SEL_##ON)(                             \
      MCAST_IF_LL(KERNEL mcast_reduce_scatter_ll_##DN##_##ON(ARGS) { MCAST_ENTRY;                   \
        ll_reduce<D, O>(a, a.count * sizeof(typename Ty<D>::E), a.count * sizeof(typename Ty<D>::E)); \
      }))
MCAST_EACH_REDUCTION(REDUCE_SCATTER_LL)
