"""stare's performance suite (`stare bench`): each benchmark against a baseline measured in the
same run. An application layer (it may import any part of stare). See docs/performance.md."""
