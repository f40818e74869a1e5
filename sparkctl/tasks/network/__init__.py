"""Phase network: netplan addresses on the fabric twins, applied safely, proven by jumbo pings; and its undo."""

from sparkctl.taskgraph.task import Task
from sparkctl.tasks.network.down import NetworkDown
from sparkctl.tasks.network.firewall import FirewallRemoveTask, FirewallTask
from sparkctl.tasks.network.forwarding import ForwardingTask
from sparkctl.tasks.network.netplan import NetplanTask
from sparkctl.tasks.network.verify import NetworkVerify

TASKS: list[Task] = [NetplanTask(), ForwardingTask(), FirewallTask(), NetworkVerify()]
DOWN_TASKS: list[Task] = [NetworkDown()]
#: what `cluster down` removes even without --network: sparkctl's firewall
FIREWALL_DOWN: list[Task] = [FirewallRemoveTask()]
