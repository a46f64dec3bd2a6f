"""The packed-CPU quantize method of GGUF loads: Q4_0/Q4_1/Q4_K (and Q8_0) blocks kept packed for torch's int4
kernel instead of dequantized.

- :mod:`.options`: what a load asks of it (``format_options``, the kernel dtype) and the kernel names;
- :mod:`.config`: :class:`~.config.GGUFQuantConfig`, the load's record of every layer's choice;
- :mod:`.linear_method` (:mod:`.decide`, :mod:`.linear_packing`, :mod:`.segments`, :mod:`.linear_state`) and
  :mod:`.embedding` (:mod:`.embedding_store`): the methods of the linear layers and of the embedding and head;
- :mod:`.q4_blocks`, :mod:`.half_split`: GGUF blocks decoded and packed into torch's layout;
- :mod:`.plan`: each layer's kernel from the header alone (``loader inspect --layers``);
- :mod:`.bundle_keys`: which packed-weights bundle a load uses and how its units are keyed.
"""
