"""Stage 3, server: launch or attach to SGLang, gate on health and pre-flight, /generate."""
