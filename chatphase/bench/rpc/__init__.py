"""The RPC link sweep: the model split over llama.cpp RPC devices behind emulated links (``bench --rpc-rtt``)."""
