variable "cluster_name" {
  description = "kit cluster name; prefix of every resource name."
  type        = string
  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{0,30}$", var.cluster_name))
    error_message = "cluster_name: a lowercase letter, then up to 30 lowercase letters, digits or '-'."
  }
}

variable "nodes" {
  description = "Number of nodes (node rank = index)."
  type        = number
  validation {
    condition     = var.nodes >= 1 && floor(var.nodes) == var.nodes
    error_message = "nodes must be a whole number >= 1."
  }
}

variable "instance_type" {
  description = "EC2 instance type, e.g. g5.4xlarge."
  type        = string
}

variable "availability_zone" {
  description = "The one zone every node (and its data volume) lives in."
  type        = string
}

variable "market" {
  description = "spot or on-demand. Only this decides instance_market_options."
  type        = string
  validation {
    condition     = contains(["spot", "on-demand"], var.market)
    error_message = "market must be spot or on-demand."
  }
}

variable "max_price" {
  description = "Spot price cap in $/h per node (null: the on-demand price, AWS's default)."
  type        = number
  default     = null
}

variable "ami" {
  description = "AMI id; null picks the latest AWS Deep Learning Base AMI (Ubuntu 22.04, NVIDIA driver) for x86_64."
  type        = string
  default     = null
}

variable "root_volume_size_gb" {
  description = "Root volume size in GiB (encrypted gp3)."
  type        = number
  default     = 100
  validation {
    condition     = var.root_volume_size_gb >= 8
    error_message = "root_volume_size_gb must be at least 8."
  }
}

variable "subnet_id" {
  description = "Subnet in availability_zone; null uses the default subnet of the zone."
  type        = string
  default     = null
}

variable "vpc_id" {
  description = "VPC of the subnet; null uses the region's default VPC."
  type        = string
  default     = null
}

variable "placement_group" {
  description = "Cluster placement group name (null: none)."
  type        = string
  default     = null
}

variable "detailed_monitoring" {
  description = "CloudWatch detailed (1-minute) monitoring, billed per instance."
  type        = bool
  default     = false
}

variable "ssh_user" {
  description = "Login user of the image (informational; used in outputs)."
  type        = string
  default     = "ubuntu"
}

variable "ssh_public_key" {
  description = "OpenSSH public key (content) installed for ssh_user."
  type        = string
}

variable "allowed_cidrs" {
  description = "IPv4 CIDRs that may reach SSH (22/tcp)."
  type        = list(string)
  validation {
    condition     = length(var.allowed_cidrs) > 0 && alltrue([for c in var.allowed_cidrs : can(cidrhost(c, 0))])
    error_message = "allowed_cidrs must be a non-empty list of CIDRs."
  }
}

variable "egress_cidrs" {
  description = "IPv4 CIDRs the nodes may reach on every port (package mirrors, images, the kit watcher); [] = the cluster only."
  type        = list(string)
  default     = ["0.0.0.0/0"]
  validation {
    condition     = alltrue([for c in var.egress_cidrs : can(cidrhost(c, 0))])
    error_message = "egress_cidrs must be a list of CIDRs."
  }
}

variable "disk_ids" {
  description = "Data volume ids in node-rank order (from the disks root module)."
  type        = list(string)
}

variable "tags" {
  description = "Tags for every resource (kit:cluster etc.)."
  type        = map(string)
  default     = {}
}

variable "checkpoint_bucket" {
  description = "S3 bucket the nodes copy checkpoints to (null: none; no role is created)."
  type        = string
  default     = null
}

variable "checkpoint_prefix" {
  description = "Key prefix of this job's checkpoints in checkpoint_bucket; the nodes may write nothing else."
  type        = string
  default     = ""
}
