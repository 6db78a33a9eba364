"""Create a llama.cpp context (through llama-cpp-python's C API) so llama.cpp logs its KV cache size.

    python kv_probe.py MODEL N_CTX N_SEQ KV_TYPE     (stderr carries llama.cpp's log)
"""

import sys

import llama_cpp

path, n_ctx, n_seq, kv_type = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
llama_cpp.llama_backend_init()
model = llama_cpp.llama_model_load_from_file(path.encode(), llama_cpp.llama_model_default_params())
params = llama_cpp.llama_context_default_params()
params.n_ctx, params.n_seq_max, params.type_k, params.type_v = n_ctx, n_seq, kv_type, kv_type
params.flash_attn_type = 1 if kv_type != 1 else 0  # a quantised V cache needs flash attention
context = llama_cpp.llama_init_from_model(model, params)
print(llama_cpp.llama_n_ctx(context))
