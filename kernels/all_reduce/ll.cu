// kernels/all_reduce/ll.cu: the LL all-reduce's entry points mcast_all_reduce_ll_<dtype>_<op> (the
// LL protocol and ll_reduce are in ll.cuh).

#define ALL_REDUCE_LL(DN, D, ON, O)                                    \
  MCAST_WHEN(MCAST_SEL_all_reduce, MCAST_SEL_##DN, MCAST_SEL_##ON)(    \
      MCAST_IF_LL(KERNEL mcast_all_reduce_ll_##DN##_##ON(ARGS) { MCAST_ENTRY; \
        ll_reduce<D, O>(a, 0, a.count * sizeof(typename Ty<D>::E));    \
      }))
MCAST_EACH_REDUCTION(ALL_REDUCE_LL)
