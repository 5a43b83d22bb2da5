//! Store conformance suite (filled below).
