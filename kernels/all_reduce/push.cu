// kernels/all_reduce/push.cu: the all-reduces of the push protocol (kernels/push.cuh) and their
// entry points: the push one-shot mcast_all_reduce_p2p_push_<dtype>_<op> (every rank stores its
// whole message into its peers' scratch rows and reduces everything) and the pushing two-shot
// mcast_all_reduce_p2p_twoshot_push_<dtype>_<op> (rank p gets slice p of every rank's message,
// reduces it and stores it into every rank's out).

// Push one-shot (nranks <= MCAST_PUSH_MAX_RANKS): reads nothing but this rank's own data, so it
// serves the pointer form on memory no peer can map, at any size, in one launch.
#define ALL_REDUCE_PUSH(DN, D, ON, O)                                  \
  MCAST_WHEN(MCAST_SEL_all_reduce, MCAST_SEL_##DN, MCAST_SEL_##ON)( \
      KERNEL mcast_all_reduce_p2p_push_##DN##_##ON(ARGS) { MCAST_ENTRY; p2p_push<D, O, MCAST_PUSH_ALL>(a); })
MCAST_EACH_REDUCTION(ALL_REDUCE_PUSH)

// Pushing two-shot (nranks <= MCAST_PUSH_MAX_RANKS): both halves store, none loads a peer's
// memory; one barrier, at the exit.
#define ALL_REDUCE_TWO_SHOT_PUSH(DN, D, ON, O)                         \
  MCAST_WHEN(MCAST_SEL_all_reduce, MCAST_SEL_##DN, MCAST_SEL_##ON)( \
      KERNEL mcast_all_reduce_p2p_twoshot_push_##DN##_##ON(ARGS) { MCAST_ENTRY; p2p_push<D, O, MCAST_PUSH_TWO_SHOT>(a); })
MCAST_EACH_REDUCTION(ALL_REDUCE_TWO_SHOT_PUSH)
