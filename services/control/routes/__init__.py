"""One APIRouter per resource; app.py includes them."""
