//! The runtime: contexts, teams, symmetric buffers, collectives, handles and leak tracking.
//! It knows nothing of C; `capi` converts its errors to status codes.
