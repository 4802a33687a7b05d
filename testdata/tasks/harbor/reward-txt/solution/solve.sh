#!/bin/bash

cat > /app/greet.py << 'PY'
def greet(name):
    return f"Hello, {name}!"
PY
