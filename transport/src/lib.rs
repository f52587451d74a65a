//! QUIC with mutual TLS: the PKI, principals taken from certificates, framed messages, the writers table and fault hooks. Knows nothing of Raft or the domain.
