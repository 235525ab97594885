#!/bin/bash
# The PyTorch peer after the review (its Dynamo recompile limit raised before compiling), e32 zipf, both V3 layers.
timeout 150 python3 benchmarks/peers/group_linear_torch.py --h5 $OUT/peer.h5 --filter '/torch_fp8(_compiled)?/v3_fc(1|2)/e32/t16384/zipf' > $OUT/peer.log 2>&1; echo rc=$? >> $OUT/peer.log
