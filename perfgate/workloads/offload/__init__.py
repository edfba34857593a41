"""MoE expert offload: how fast can one missed expert come off the SSD, and how often does it miss?

The reference is the second seed report: a 35B-A3B MoE model streamed from SSD on an 8 GB machine.
Per token and per layer the router picks k experts; an expert not in RAM must be read from the GGUF
file as three separate tensor segments (gate, up, down) that lie far apart in the file. Decode speed
is then bounded by (a) how long the slowest missed expert of a layer takes to read and (b) how many
experts miss.

Modules, one job each:
  gguf_layout   GGUF file -> per-expert (offset, length) segments
  page_cache    drop a file's pages from the page cache; residency check; O_DIRECT buffers
  io_probe      the device: random reads of one block size at 1..16 threads; 4 KiB latency / IOPS
  expert_reads  the critical path: one expert (3 segments) and one layer (k experts) read cold
  cache_sim     routing traces -> hit rates of LRU / Belady / hot-set pin / admit-after-N, reuse, U(k)
  decode_model  measured miss latency + hit rate + layer count -> predicted decode tok/s

Nothing here imports pytest: tests in perf/offload/ and the CLIs in tools/ both call these.
"""
