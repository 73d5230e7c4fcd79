// kernels/all_gather/ll.cu: the LL all-gather's entry point mcast_all_gather_ll (the LL protocol
// and ll_copy are in ll.cuh).

MCAST_WHEN(MCAST_SEL_all_gather, 1, 1)(MCAST_IF_LL(
    KERNEL mcast_all_gather_ll(ARGS) { MCAST_ENTRY; ll_copy(a, true); }))
