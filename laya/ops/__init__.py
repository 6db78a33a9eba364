"""Running and watching Laya: `laya up`, stats, metrics, health, lookups, the demo, benchmarks."""
