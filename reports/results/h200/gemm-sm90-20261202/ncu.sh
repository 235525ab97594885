#!/usr/bin/env bash
set -uo pipefail
R=$OUT/r; mkdir -p $R; t0=$(date +%s)
el(){ echo $(( $(date +%s) - t0 )); }
which ncu nsys > $R/tools.txt 2>&1; ls /usr/local/cuda/bin | grep -i -E "ncu|nsight" >> $R/tools.txt
NCU=$(which ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "ncu=$NCU"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DFP4MOE_WITH_CUDNN=OFF > $R/cfg.log 2>&1
cmake --build build -j 16 --target bench_grouped_gemm > $R/build.log 2>&1; echo "build $? @$(el)"
for c in 'up 8x2048' 'down 8x2048'; do
  n=$(echo $c | tr ' ' '_')
  timeout 200 $NCU --set full -k regex:grouped_gemm_sm90 -c 1 -o $R/ncu_$n build/benchmarks/bench_grouped_gemm --benchmark_filter="^fprop/fp8_sm90/$c/min" --benchmark_min_time=0.001s > $R/ncu_$n.log 2>&1; echo "ncu $n $? @$(el)"
  $NCU --import $R/ncu_$n.ncu-rep --page details > $R/ncu_$n.txt 2>&1
  timeout 100 $NCU --set full -k regex:'Kernel|gemm|sm90' -c 1 -o $R/ncu_cublas_$n build/benchmarks/bench_grouped_gemm --benchmark_filter="^fprop/fp8/$c/min" --benchmark_min_time=0.001s > $R/ncu_cublas_$n.log 2>&1
  $NCU --import $R/ncu_cublas_$n.ncu-rep --page details > $R/ncu_cublas_$n.txt 2>&1
done
rm -f $R/*.ncu-rep
grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|Registers|Achieved Occupancy|Issue Slots Busy|Tensor|Stall|warp cycles per issued" $R/ncu_up_8x2048.txt | head -40
cd $OUT && tar czf r.tgz r && rm -rf r
