// kernels/broadcast/ll.cu: the LL broadcast's entry point mcast_broadcast_ll (the LL protocol and
// ll_copy are in ll.cuh).

MCAST_WHEN(MCAST_SEL_broadcast, 1, 1)(MCAST_IF_LL(
    KERNEL mcast_broadcast_ll(ARGS) { MCAST_ENTRY; ll_copy(a, false); }))
