import services.core.deposits.models
import services.core.sweeps.models  # noqa: F401
from services.core.models import CoreBase
from shared.migrate import run_env

run_env(CoreBase.metadata)
