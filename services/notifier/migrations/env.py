from services.notifier.models import NotifierBase
from shared.migrate import run_env

run_env(NotifierBase.metadata)
