variable "cluster_name" {
  description = "kit cluster name; prefix of the volume names."
  type        = string
  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{0,30}$", var.cluster_name))
    error_message = "cluster_name: a lowercase letter, then up to 30 lowercase letters, digits or '-'."
  }
}

variable "nodes" {
  description = "Number of nodes: one data volume per node."
  type        = number
  validation {
    condition     = var.nodes >= 1 && floor(var.nodes) == var.nodes
    error_message = "nodes must be a whole number >= 1."
  }
}

variable "availability_zone" {
  description = "The cluster's zone (volumes attach only within their zone)."
  type        = string
}

variable "size_gb" {
  description = "Size of each data volume in GiB."
  type        = number
  validation {
    condition     = var.size_gb > 0
    error_message = "size_gb must be positive."
  }
}

variable "volume_type" {
  description = "EBS volume type."
  type        = string
  default     = "gp3"
  validation {
    condition     = contains(["gp3", "gp2", "io1", "io2", "st1"], var.volume_type)
    error_message = "volume_type must be one of gp3, gp2, io1, io2, st1."
  }
}

variable "kms_key_id" {
  description = "KMS key ARN for the volumes (null: the account's default EBS key)."
  type        = string
  default     = null
}

variable "tags" {
  description = "Tags for every resource (kit:cluster etc.)."
  type        = map(string)
  default     = {}
}

variable "name_suffix" {
  description = "Appended to the cluster name in the disks' names: one set of disks per zone and shape of a job that moves (\"\" for a job that does not)."
  type        = string
  default     = ""
  validation {
    condition     = can(regex("^(-[a-z0-9]{1,8})?$", var.name_suffix))
    error_message = "name_suffix: empty, or '-' and up to 8 lowercase letters or digits."
  }
}
