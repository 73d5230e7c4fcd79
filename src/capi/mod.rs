//! The C boundary: one module per C type. Panic boundary, argument checks, handle lookup,
//! status and thread-local message. No logic.
