"""The Textual TUI (the only package that imports Textual; it never imports llama_cpp)."""
